"""bench.memberstamps and bench.stampedworker: the stamps a worker notes, the parts of a
call they give (which add up to the member's own time), the wrappers put back, and a real
run on a stamped worker."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from services import flush_runtime_dbs

from bench import memberstamps, stampedworker
from bench.memberstamps import split
from bench.rtoverhead import Row
from bench.stampedworker import Stamps, read_stamps
from coordinator.runtime.liveness import start_key
from coordinator.state.store import RedisStore
from workers import lane, member


def _clock(*times: float) -> Any:
    it = iter(times)
    return lambda: next(it)


def _begun(member_id: str, made: bool) -> SimpleNamespace:
    return SimpleNamespace(made=made, start=SimpleNamespace(start_claim=start_key(member_id)))


def test_a_member_s_claim_and_call_are_stamped(tmp_path: Path) -> None:
    out = tmp_path / "stamps.txt"
    stamps = Stamps(out, clock=_clock(1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0))
    record = stamps.wrap_record(lambda owner, tag, entry, begun, more: (True, None))
    start = stamps.wrap_start(lambda store, s: "started")
    call = stamps.wrap_call(lambda task, *rest: ("result", rest))

    def failing(task: Any, *rest: Any) -> Any:
        raise RuntimeError("backend down")

    assert record(None, "t1", b"e", _begun("m1", True), False) == (True, None)  # at 1.0
    assert record(None, "t2", b"e", _begun("m2", False)) == (True, None)  # not made: no stamp
    assert call(SimpleNamespace(member_id="m1"), "b", "s") == ("result", ("b", "s"))  # 2, 3
    with pytest.raises(RuntimeError):
        stamps.wrap_call(failing)(SimpleNamespace(member_id="m2"))  # 4, 5: still noted
    # A start made in its own round trip (the second of two members taken together).
    assert start(None, SimpleNamespace(start_claim=start_key("m3"))) == "started"  # at 6.0
    assert call(SimpleNamespace(member_id="m3")) == ("result", ())  # 7, 8
    assert not out.exists()  # nothing written before a flush
    stamps.flush()
    assert read_stamps(out) == {
        "m1": (1.0, 2.0, 3.0), "m2": (0.0, 4.0, 5.0), "m3": (6.0, 7.0, 8.0)
    }  # fmt: skip
    assert stamps.made == {}  # each claim stamp taken by its call


def test_the_stamps_are_written_until_the_stop_and_once_after(tmp_path: Path) -> None:
    out, stop = tmp_path / "stamps.txt", threading.Event()
    stamps = Stamps(out, clock=_clock(1.0, 2.0, 3.0, 4.0))
    call = stamps.wrap_call(lambda task, *rest: None)
    call(SimpleNamespace(member_id="m1"))
    writer = stamps.flushing(stop, every_s=60.0)  # no periodic write within the test
    call(SimpleNamespace(member_id="m2"))
    stop.set()
    writer.join(timeout=10.0)
    assert not writer.is_alive()
    assert read_stamps(out) == {"m1": (0.0, 1.0, 2.0), "m2": (0.0, 3.0, 4.0)}


def test_install_puts_the_wrappers_in_and_back(tmp_path: Path) -> None:
    record, call = lane.MemberLane._record, member._call
    assert "start_member" not in vars(RedisStore)  # inherited: put back by deleting
    restore = stampedworker.install(Stamps(tmp_path / "s.txt"))
    try:
        assert lane.MemberLane._record is not record and member._call is not call
        assert "start_member" in vars(RedisStore)
    finally:
        restore()
    assert lane.MemberLane._record is record and member._call is call
    assert "start_member" not in vars(RedisStore)


def _trace(member_id: str, started: float, finished: float, status: str = "succeeded") -> Any:
    return {
        "member_id": member_id, "started_at_s": started, "finished_at_s": finished,
        "status": status, "proc_latency_s": 0.2,
    }  # fmt: skip


def _row(gid: str, t0: float, t1: float) -> Row:
    """A call as the overhead bench's haco_calls gives it (its latency and winner unused)."""
    return (gid, t0, t1, t1 - t0, "")


def test_a_call_s_parts_add_up_to_its_member_s_own_time() -> None:
    rows = [_row("g1", 10.0, 12.0), _row("g2", 20.0, 21.0), _row("g3", 30.0, 31.0)]
    rows.append(_row("g4", 40.0, 41.0))
    traces = {
        "g1": [_trace("a", 10.5, 11.5)],
        "g2": [_trace("b", 20.1, 20.9)],  # no stamp
        "g3": [_trace("c", 30.1, 30.9)],  # its start made in its own round trip
        # g4: no trace
    }
    stamps = {"a": (10.6, 10.7, 11.4), "c": (0.0, 30.2, 30.8)}
    parts, missing = split(rows, traces, stamps)
    assert missing == 3
    got = {k: v[0] for k, v in parts.items()}
    assert got["own"] == pytest.approx(1.0) and got["call"] == pytest.approx(2.0)
    assert got["claim"] + got["handoff"] + got["backend"] + got["after"] == pytest.approx(1.0)
    assert got["backend"] == pytest.approx(0.7) and got["beyond_draw"] == pytest.approx(0.5)
    assert got["less_own"] == pytest.approx(1.0) and got["less_backend"] == pytest.approx(1.3)


def test_two_members_count_from_the_fastest() -> None:
    rows = [_row("g", 10.0, 12.0)]
    # x's own time is the smaller (0.6 against 0.8); y's backend call the shorter.
    traces = {
        "g": [_trace("x", 10.2, 10.8), _trace("y", 10.1, 10.9), _trace("z", 10, 11, "failed")]
    }
    stamps = {"x": (10.3, 10.35, 10.75), "y": (10.2, 10.3, 10.6)}
    parts, missing = split(rows, traces, stamps)
    got = {k: v[0] for k, v in parts.items()}
    assert missing == 0 and got["own"] == pytest.approx(0.6) and got["claim"] == pytest.approx(0.1)
    assert got["less_own"] == pytest.approx(1.4) and got["less_backend"] == pytest.approx(1.7)
    # A succeeded member without its stamps leaves the call out.
    assert split(rows, traces, {"x": stamps["x"]})[1] == 1


@pytest.fixture
def stamped(
    runtime_redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[stampedworker.StampedServices]:
    monkeypatch.setenv("HACO_REDIS_URL", runtime_redis_url)
    flush_runtime_dbs(runtime_redis_url)
    svc = stampedworker.StampedServices(tmp_path, 2)
    try:
        svc.start_haco()
        svc.start_bare()
        yield svc
    finally:
        svc.close()
        flush_runtime_dbs(runtime_redis_url)


def test_a_run_on_a_stamped_worker_takes_every_call_apart(
    stamped: stampedworker.StampedServices,
) -> None:
    res = memberstamps.run(stamped, n=20, rounds=2, warmup=5)
    assert res["bare_roundtrip"]["n"] == 20
    inside = ("claim", "handoff", "backend", "after")
    for key in ("haco_1", "haco_2"):
        parts = res[key]
        assert parts["missing"] == 0, parts
        assert all(parts[k]["n"] == 20 for k in memberstamps.PARTS), parts
        own = parts["own"]["mean_ms"]
        assert sum(parts[k]["mean_ms"] for k in inside) == pytest.approx(own)
        # The backend's call is inside the member's own window: less it, a call is longer.
        assert parts["less_backend"]["mean_ms"] > parts["less_own"]["mean_ms"] > 0
    assert len(res["ratios"]) == 8 and all(v > 0 for v in res["ratios"].values())
