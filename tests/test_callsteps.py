"""bench.callsteps: every step it times is found on the code as it is, its times add up
within a real call, and the code is put back as it was after."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from services import flush_runtime_dbs

import coordinator.runtime.coordinator as coordinator_module
from bench import callsteps
from bench.rtlib import Services, bench_client
from coordinator.core.methods import Haco


def test_a_wrapped_step_adds_up_and_passes_through() -> None:
    times = callsteps.StepTimes()
    calls: list[int] = []

    def step(x: int) -> int:
        calls.append(x)
        if x < 0:
            raise ValueError(x)
        return x + 1

    wrapped = times.wrap(step, "step")
    assert wrapped(1) == 2 and times.calls == []  # not measuring: nothing noted
    times.current = {}
    assert wrapped(2) == 3
    with pytest.raises(ValueError):
        wrapped(-1)  # an error still counts its time
    assert set(times.current) == {"step"} and times.current["step"] > 0
    assert calls == [1, 2, -1]


def test_every_step_is_found_and_put_back(runtime_redis_url: str) -> None:
    client = bench_client(runtime_redis_url)
    coord = client.coordinator
    before = {
        "choose": Haco.__dict__["choose"],
        "payload_bytes": coordinator_module.payload_bytes,
        "stage_closes": coordinator_module.stage_closes,
    }
    try:
        with callsteps.timed_steps(client, callsteps.StepTimes()):
            assert Haco.__dict__["choose"] is not before["choose"]
            assert "_plan" in vars(coord) and "invocation" in vars(client)
        assert Haco.__dict__["choose"] is before["choose"]
        assert coordinator_module.payload_bytes is before["payload_bytes"]
        assert coordinator_module.stage_closes is before["stage_closes"]
        assert "_plan" not in vars(coord) and "invocation" not in vars(client)
        assert "message" not in vars(coord.dispatcher.wire)  # type: ignore[attr-defined]
    finally:
        client.close()


@pytest.fixture
def bench_services(
    runtime_redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Services]:
    """The bench's own services (a HACO worker) on this run's Redis server."""
    monkeypatch.setenv("HACO_REDIS_URL", runtime_redis_url)
    flush_runtime_dbs(runtime_redis_url)
    svc = Services(tmp_path, 2)
    try:
        svc.start_haco()
        yield svc
    finally:
        svc.close()
        flush_runtime_dbs(runtime_redis_url)


def test_a_calls_steps_add_up(bench_services: Services) -> None:
    res = callsteps.run(bench_services, n=20, role="one", warmup=5)
    steps = res["steps"]
    assert all(s["n"] == 20 for s in steps.values()), {k: s["n"] for k, s in steps.items()}
    assert res["plan_rest"]["n"] == 20 and res["plan_rest"]["p50_ms"] >= 0
    # Each call's whole holds its steps, and each step the steps timed inside it: so
    # the means (unlike the medians) add up.
    mean = {k: s["mean_ms"] for k, s in steps.items()}
    top = ("invocation", "_plan", "_launch_initial", "_wait", "_finish")
    assert res["call"]["mean_ms"] >= sum(mean[k] for k in top)
    assert mean["_plan"] >= sum(mean[k] for k in callsteps.PLAN_PARTS)
    assert mean["_launch_initial"] >= mean["_prepare"] + mean["stage_closes"] + mean["_publish"]
    assert mean["_publish"] >= mean["message"] and mean["_prepare"] >= mean["member_task"]
