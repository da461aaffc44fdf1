"""The harvester against real Redis and real Postgres (this run's own Redis database and a
fresh Postgres database for the module, tests/services.py), and, for the outage test, an
embedded Postgres of the test's own, which it stops and restarts (the servers other
tests use are never stopped)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from polling import wait_for
from psycopg_pool import ConnectionPool
from services import UNREACHABLE_REDIS_URL, open_pool, private_state_dir
from typer.testing import CliRunner

from coordinator.cli.main import app
from coordinator.config import HacoSettings
from coordinator.services.embedded_pg import EmbeddedPostgres
from coordinator.services.supervisor import Stack
from coordinator.state import keys
from coordinator.state.store import RedisStore
from coordinator.tracestore.harvester import Harvester
from coordinator.tracestore.migrate import migrate
from schemas.models import MemberReport, MemberTrace

ROOT = Path(__file__).resolve().parent.parent


def report_json(i: int, group: str | None = None, **trace: Any) -> str:
    """A valid MemberReport for member ``m<i>`` (group ``g<i//3>`` unless given)."""
    g = group or f"g{i // 3}"
    t0 = 1_700_000_000.0 + i * 0.001
    fields: dict[str, Any] = {
        "invocation_id": g,
        "group_id": g,
        "member_id": f"{g}-m{i}",
        "candidate_id": "coder-us",
        "role": "coder",
        "model": "sim-model",
        "zone": "us",
        "caller_zone": "eu",
        "rank": i % 3,
        "u_plus": 0.5,
        "r_minus": 0.1,
        "started_at_s": t0,
        "finished_at_s": t0 + 0.5,
        "status": "succeeded",
        "success": True,
        "quality": 0.8,
        "latency_s": 0.6,
        "proc_latency_s": 0.4,
        "tokens_in": 100,
        "tokens_out": 200,
        "bytes_sent": 4000,
        "rtt_s": 0.05,
        "bandwidth_Bps": 1e6,
        "lost": False,
    }
    fields.update(trace)
    return MemberReport(trace=MemberTrace.model_validate(fields), output="ok").model_dump_json()


def push(r: redis.Redis, reports: list[str]) -> list[str]:
    pipe = r.pipeline(transaction=False)
    for rep in reports:
        pipe.xadd(keys.TRACES, {"report": rep})
    return [i.decode() for i in pipe.execute()]


def read_as(r: redis.Redis, s: HacoSettings, consumer: str, count: int) -> list[str]:
    """New entries read by another consumer of the harvest group (left pending)."""
    got: Any = r.xreadgroup(s.harvest_group, consumer, {keys.TRACES: ">"}, count=count)
    return [i.decode() for i, _ in got[0][1]] if got else []


def settings(**overrides: Any) -> HacoSettings:
    base: dict[str, Any] = {"harvest_batch": 1000, "harvest_block_ms": 50}
    return HacoSettings(**{**base, **overrides})


def scalar(url: str, query: str) -> Any:
    with psycopg.connect(url) as conn:
        row = conn.execute(query.encode()).fetchone()
        return None if row is None else row[0]


def metrics(r: redis.Redis) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in r.hgetall(keys.METRICS).items()}


def test_a_batch_lands_in_members_invocations_and_links(
    r: redis.Redis, pool: ConnectionPool, db: str
) -> None:
    push(r, [report_json(i) for i in range(30)])
    push(r, [report_json(30, group="gx", status="failed", success=False, failure_kind="network",
                         failure_reason="lost", quality=None, bytes_sent=0, rtt_s=None,
                         bandwidth_Bps=None, lost=True)])  # fmt: skip
    h = Harvester(r, pool, settings(), "h1")
    assert h.run_once() == 31
    assert scalar(db, "SELECT count(*) FROM members") == 31
    assert scalar(db, "SELECT count(*) FROM invocations") == 11
    assert scalar(db, "SELECT sum(members) FROM invocations") == 31
    assert scalar(db, "SELECT members FROM invocations WHERE group_id = 'g0'") == 3
    assert scalar(db, "SELECT state FROM invocations WHERE group_id = 'gx'") == "running"
    assert scalar(db, "SELECT count(*) FROM link_observations") == 31
    assert scalar(db, "SELECT link_id FROM link_observations LIMIT 1") == "eu->us"
    assert scalar(db, "SELECT transfer_s FROM link_observations WHERE member_id='g0-m0'") == (
        pytest.approx(0.004)
    )
    assert scalar(db, "SELECT failure_kind FROM members WHERE group_id = 'gx'") == "network"
    assert r.xlen(keys.TRACES) == 0  # committed entries are acknowledged and deleted
    assert r.xpending(keys.TRACES, h.group)["pending"] == 0
    m = metrics(r)
    assert m["harvest_rows"] == 31 and m["harvest_entries"] == 31
    assert r.pttl(keys.METRICS) > 0


def test_the_link_view_shows_each_observed_member_that_records_a_transmission(
    r: redis.Redis, pool: ConnectionPool, db: str
) -> None:
    """link_observations (a view since migration 0006) holds what the harvester's link
    rows held: one row per member that records a transmission and is an observation."""
    failed = {"status": "failed", "success": False, "quality": None}
    no_link = {"bytes_sent": 0, "rtt_s": None, "bandwidth_Bps": None}
    reports = [
        report_json(0),
        report_json(1, bandwidth_Bps=0.0),  # no transfer time
        report_json(2, **no_link),  # records no transmission
        report_json(3, **no_link, **failed, lost=True, failure_kind="network"),
        report_json(4, **failed | {"status": "cancelled"}, failure_kind="cancelled"),  # no obs.
    ]
    push(r, reports)
    assert Harvester(r, pool, settings(), "h1").run_once() == 5
    with psycopg.connect(db) as conn:
        rows = conn.execute(
            "SELECT member_id, l.link_id, l.observed_at = m.finished_at, l.bytes, l.lost, "
            "l.transfer_s, l.rtt_s, l.leg FROM link_observations l JOIN members m "
            "USING (member_id) ORDER BY 1"
        ).fetchall()
    assert rows == [
        ("g0-m0", "eu->us", True, 4000.0, False, pytest.approx(0.004), 0.05, 0),
        ("g0-m1", "eu->us", True, 4000.0, False, None, 0.05, 0),
        ("g1-m3", "eu->us", True, 0.0, True, None, None, 0),
    ]


def test_duplicate_stream_delivery_does_not_duplicate_rows(
    r: redis.Redis, pool: ConnectionPool, db: str
) -> None:
    reports = [report_json(i) for i in range(12)]
    # The same member three times in one batch, and the whole batch again later.
    push(r, [*reports, reports[0], reports[0]])
    h = Harvester(r, pool, settings(), "h1")
    assert h.run_once() == 12
    push(r, reports)
    assert h.run_once() == 0
    assert scalar(db, "SELECT count(*) FROM members") == 12
    assert scalar(db, "SELECT sum(members) FROM invocations") == 12
    assert scalar(db, "SELECT count(*) FROM link_observations") == 12
    assert metrics(r)["harvest_duplicates"] == 14


def test_malformed_entries_go_to_the_dead_letter_stream(
    r: redis.Redis, pool: ConnectionPool, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    good = [report_json(i) for i in range(5)]
    bad_json = "{not json"
    contradicting = report_json(5).replace('"success":true', '"success":false')
    overflow = report_json(6, tokens_in=2**40)  # valid report, Postgres rejects the row
    ids = push(r, [*good, bad_json, contradicting, overflow])
    r.xadd(keys.TRACES, {"other": "field"})
    h = Harvester(r, pool, settings(), "h1")
    with caplog.at_level(logging.ERROR, "coordinator.tracestore.harvester"):
        assert h.run_once() == 5
    assert scalar(db, "SELECT count(*) FROM members") == 5
    dead = r.xrange(keys.TRACES_DEAD)
    assert len(dead) == 4
    by_id = {f[b"id"].decode(): f for _, f in dead}
    assert by_id[ids[5]][b"report"].decode() == bad_json
    assert b"success=False contradicts" in by_id[ids[6]][b"error"]
    assert b"rejected by postgres" in by_id[ids[7]][b"error"]
    assert r.pttl(keys.TRACES_DEAD) > 0
    assert metrics(r)["harvest_dead_letter"] == 4
    assert r.xlen(keys.TRACES) == 0
    assert sum("moved to" in rec.getMessage() for rec in caplog.records) == 4


def test_reclaims_what_a_dead_consumer_left_pending(
    r: redis.Redis, pool: ConnectionPool, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    s = settings(harvest_reclaim_idle_s=0.2)
    h = Harvester(r, pool, s, "alive")
    h.run_once()  # creates the group
    ids = push(r, [report_json(i) for i in range(20)])
    assert read_as(r, s, "dead", 100) == ids  # then the consumer dies
    r.xdel(keys.TRACES, ids[0])  # trimmed while pending: lost, and said so
    assert h.run_once() == 0  # not ours, not new
    assert h.reclaim() == 0  # not idle long enough yet
    stored: list[int] = []
    with caplog.at_level(logging.ERROR, "coordinator.tracestore.harvester"):
        wait_for("reclaim", lambda: stored.append(h.reclaim()) or sum(stored) > 0, 10)
    assert sum(stored) == 19
    assert scalar(db, "SELECT count(*) FROM members") == 19
    assert r.xpending(keys.TRACES, s.harvest_group)["pending"] == 0
    assert metrics(r)["harvest_lost"] == 1
    assert any("trimmed" in rec.getMessage() for rec in caplog.records)


def test_the_stream_keeps_only_unacknowledged_entries_while_an_older_one_is_pending(
    r: redis.Redis, pool: ConnectionPool, db: str
) -> None:
    s = settings(harvest_batch=10)
    h = Harvester(r, pool, s, "h")
    h.run_once()  # creates the group
    held = push(r, [report_json(i) for i in range(5)])
    assert read_as(r, s, "other", 5) == held  # another harvester's batch, in flight
    push(r, [report_json(i) for i in range(5, 25)])
    assert h.run_once() + h.run_once() == 20
    # Acknowledged after an entry still pending: out one by one, not left behind.
    assert [i.decode() for i, _ in r.xrange(keys.TRACES)] == held
    r.xack(keys.TRACES, s.harvest_group, *held)
    push(r, [report_json(i) for i in range(25, 28)])
    assert h.run_once() == 3
    assert r.xlen(keys.TRACES) == 0  # the later batch's trim takes what was acked before it
    assert scalar(db, "SELECT count(*) FROM members") == 23


def test_lag_metrics_and_the_buffer_alarm(
    r: redis.Redis, pool: ConnectionPool, caplog: pytest.LogCaptureFixture
) -> None:
    s = settings(harvest_buffer_alarm=25)
    h = Harvester(r, pool, s, "h1")
    h.run_once()
    push(r, [report_json(i) for i in range(30)])
    r.xreadgroup(s.harvest_group, "slow", {keys.TRACES: ">"}, count=10)
    with caplog.at_level(logging.ERROR, "coordinator.tracestore.harvester"):
        lag = h.update_lag()
        h.update_lag()
    assert lag.stream_len == 30 and lag.pending == 10
    assert lag.oldest_pending_age_s is not None and 0 <= lag.oldest_pending_age_s < 60
    assert lag.oldest_entry_age_s is not None and lag.oldest_entry_age_s >= 0
    m = metrics(r)
    assert m["harvest_stream_len"] == 30 and m["harvest_pending"] == 10
    assert "harvest_oldest_pending_ms" in m and "harvest_oldest_entry_ms" in m
    assert m["harvest_buffer_alarm"] == 2  # every batch while above
    assert sum("buffer alarm" in rec.getMessage() for rec in caplog.records) == 2
    assert h.run_once() == 20  # drains the 20 unread; below the alarm again
    assert metrics(r)["harvest_buffer_alarm"] == 2
    # An alarm set past the cap would only sound after traces are lost: it is clamped.
    late = Harvester(r, pool, settings(harvest_buffer_alarm=10**9), "h2")
    assert late.alarm_at == s.trace_stream_maxlen - 1
    assert Harvester(r, pool, settings(), "h3").alarm_at == int(0.8 * s.trace_stream_maxlen)


CRASH_EXIT_CODE = 17
# A harvester process whose fault-injection point kills it right after its first commit.
CRASHING_HARVESTER = f"""
import os, sys, redis
from psycopg_pool import ConnectionPool
from coordinator.config import HacoSettings
from coordinator.tracestore.harvester import Harvester
client = redis.Redis.from_url(sys.argv[2])
pool = ConnectionPool(sys.argv[1], min_size=1, max_size=1, open=False)
pool.open(wait=True)
crash = lambda: os._exit({CRASH_EXIT_CODE})
Harvester(client, pool, HacoSettings(), "doomed", after_commit=crash).run_once()
sys.exit(3)  # unreachable: the fault exits right after the commit
"""


def test_killed_between_commit_and_ack_loses_and_duplicates_nothing(
    r: redis.Redis, redis_url: str, pool: ConnectionPool, db: str
) -> None:
    s = settings(harvest_reclaim_idle_s=0.2)
    Harvester(r, pool, s, "rescuer").run_once()  # the group exists before the entries
    push(r, [report_json(i) for i in range(500)])
    env = {**os.environ, "HACO_HARVEST_BATCH": "200"}
    proc = subprocess.run(
        [sys.executable, "-c", CRASHING_HARVESTER, db, redis_url],
        cwd=ROOT, env=env, capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == CRASH_EXIT_CODE, proc.stderr.decode()
    assert scalar(db, "SELECT count(*) FROM members") == 200  # committed ...
    assert r.xpending(keys.TRACES, s.harvest_group)["pending"] == 200  # ... never acked
    rescuer = Harvester(r, pool, s, "rescuer")
    reclaimed: list[int] = []
    wait_for("reclaim", lambda: reclaimed.append(rescuer.reclaim()) or bool(
        r.xpending(keys.TRACES, s.harvest_group)["pending"] == 0), 20)  # fmt: skip
    assert sum(reclaimed) == 0  # all 200 were in already
    while rescuer.run_once():
        pass
    assert scalar(db, "SELECT count(*) FROM members") == 500
    assert scalar(db, "SELECT count(DISTINCT member_id) FROM members") == 500
    assert scalar(db, "SELECT sum(members) FROM invocations") == 500
    assert r.xlen(keys.TRACES) == 0
    assert metrics(r)["harvest_duplicates"] == 200


def test_after_commit_runs_between_the_commit_and_the_ack(
    r: redis.Redis, pool: ConnectionPool, db: str
) -> None:
    s = settings()
    Harvester(r, pool, s, "h1").run_once()  # the group exists before the entries
    push(r, [report_json(i) for i in range(5)])

    def fault() -> None:
        assert scalar(db, "SELECT count(*) FROM members") == 5  # committed ...
        raise OSError("injected")

    with pytest.raises(OSError, match="injected"):
        Harvester(r, pool, s, "h1", after_commit=fault).run_once()
    assert r.xpending(keys.TRACES, s.harvest_group)["pending"] == 5  # ... never acked
    assert Harvester(r, pool, s, "h1").run_once() == 0  # redelivered: nothing twice
    assert scalar(db, "SELECT count(*) FROM members") == 5
    assert r.xlen(keys.TRACES) == 0


def test_traces_export_and_tail_read_the_store(
    r: redis.Redis, pool: ConnectionPool, db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    push(r, [report_json(i) for i in range(10)])
    Harvester(r, pool, settings(), "h1").run_once()
    monkeypatch.setenv("HACO_DATABASE_URL", db)
    runner = CliRunner()
    out = tmp_path / "t.csv"
    res = runner.invoke(app, ["traces", "export", "--since", "2023-11-14T22:13:20.505", "--format",
                              "csv", "--out", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    lines = out.read_text().splitlines()
    assert lines[0].startswith("member_id,group_id,") and len(lines) == 1 + 5  # finished >= since
    res = runner.invoke(app, ["traces", "export", "--since", "2023-01-01T00:00Z"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert [row["member_id"] for row in rows] == [f"g{i // 3}-m{i}" for i in range(10)]
    res = runner.invoke(app, ["traces", "tail", "-n", "3"])
    assert res.exit_code == 0, res.output
    tail = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert [row["member_id"] for row in tail] == ["g2-m7", "g2-m8", "g3-m9"]
    res = runner.invoke(app, ["traces", "export", "--since", "last tuesday"])
    assert res.exit_code == 2 and "ISO 8601" in res.output
    monkeypatch.setenv("HACO_DATABASE_URL", "")
    monkeypatch.setenv("HACO_STATE_DIR", str(tmp_path / "nothing-here"))
    res = runner.invoke(app, ["traces", "tail"])
    assert res.exit_code == 1 and "HACO_DATABASE_URL is unset" in res.output


def test_haco_up_stack_runs_and_stops_a_harvester(
    db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing listens there: the harvester retries Redis with backoff until stopped.
    monkeypatch.setenv("HACO_DATABASE_URL", db)
    stack = Stack(UNREACHABLE_REDIS_URL, None, log_dir=tmp_path)
    proc = stack.start_harvester()
    log = tmp_path / "harvester.log"
    try:
        wait_for(
            "the harvester's retry", lambda: log.exists() and "redis failed" in log.read_text()
        )
    finally:
        stack.stop()
    assert proc.returncode == 0 and stack.harvester is None


# -- Postgres down --------------------------------------------------------------------


@pytest.fixture
def throwaway_pg() -> Iterator[EmbeddedPostgres]:
    """An embedded Postgres of this test's own (tests/services.py: state dir outside
    tmp_path), migrated; the test stops and restarts it. Its URL (a unix socket in its
    data dir) stays the same across a restart."""
    with private_state_dir("haco-test-outage-") as state_dir, EmbeddedPostgres(state_dir) as pg:
        assert pg.url is not None
        with psycopg.connect(pg.url, autocommit=True) as conn:
            migrate(conn)
        yield pg


def test_postgres_stopped_during_load_then_restarted_loses_nothing(
    r: redis.Redis, throwaway_pg: EmbeddedPostgres
) -> None:
    n, chunk = 6000, 200
    s = settings(harvest_batch=500, harvest_buffer_alarm=2000, harvest_backoff_max_s=0.5)
    store = RedisStore(r)
    url = str(throwaway_pg.url)
    pool = open_pool(url, timeout=1.0)
    stop = threading.Event()
    h = Harvester(r, pool, s, "h1")
    thread = threading.Thread(target=h.run, args=(stop,), daemon=True)
    thread.start()
    try:

        def produce(lo: int, hi: int) -> None:  # the workers' append path
            for i in range(lo, hi):
                store.append_trace(report_json(i), s.trace_stream_maxlen, s.trace_stream_ttl_s)

        def stored() -> int:
            return int(scalar(url, "SELECT count(*) FROM members"))

        for lo in range(0, n // 3, chunk):
            produce(lo, lo + chunk)
        wait_for("the first third stored", lambda: stored() == n // 3)
        throwaway_pg.stop()
        for lo in range(n // 3, n, chunk):
            produce(lo, lo + chunk)
        wait_for("a failed write", lambda: metrics(r).get("harvest_db_errors", 0) >= 2)
        wait_for("the buffer alarm", lambda: metrics(r).get("harvest_buffer_alarm", 0) >= 1)
        assert r.xlen(keys.TRACES) == n - n // 3  # everything waits in the stream
        assert throwaway_pg.start() == url
        wait_for("every trace stored", lambda: r.xlen(keys.TRACES) == 0, 90)
    finally:
        stop.set()
        thread.join(30)
        pool.close()
    assert stored() == n
    assert scalar(url, "SELECT sum(members) FROM invocations") == n
    assert r.xpending(keys.TRACES, s.harvest_group)["pending"] == 0
    assert metrics(r).get("harvest_lost", 0) == 0
