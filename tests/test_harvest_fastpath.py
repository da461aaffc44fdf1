"""The harvester's two ways into Postgres against real Redis and Postgres: first
deliveries copied straight in, redeliveries merged, and the fallback between them; and
the pipelined loop (``Harvester.run``). Helpers from test_harvester.py."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import psycopg
import pytest
import redis
from polling import wait_for
from psycopg_pool import ConnectionPool
from test_harvester import metrics, push, report_json, scalar, settings

from coordinator.state import keys
from coordinator.tracestore.harvester import Harvester


def snapshot(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every stored row, but the columns a second delivery changes (stream id, time)."""
    queries = {
        "members": "SELECT member_id, group_id, candidate_id, role, zone, caller_zone, model, "
        "rank, u_plus, r_minus, started_at, finished_at, status, failure_kind, failure_reason, "
        "quality, judged_at, latency_s, proc_latency_s, tokens_in, tokens_out, bytes_sent, "
        "rtt_s, bandwidth_bps, lost FROM members ORDER BY member_id",
        "links": "SELECT * FROM link_observations ORDER BY member_id",
        "invocations": "SELECT * FROM invocations ORDER BY group_id",
    }
    with psycopg.connect(url) as conn:
        return {k: conn.execute(q.encode()).fetchall() for k, q in queries.items()}


def verdict_json(group: str, **fields: Any) -> str:
    v: dict[str, Any] = {
        "group_id": group, "role": "coder", "state": "won", "winner_member": f"{group}-m0",
        "p_success": 0.9, "stop": "target_reached", "launch_mode": "parallel",
        "winner_mode": "ranked", "started_at_s": 1_699_999_999.5, "decided_at_s": 1_700_000_001.0,
        "latency_s": 1.5, "planned": 3, "launched": 3, "succeeded": 3,
    }  # fmt: skip
    return json.dumps({**v, **fields})


def mixed_entries() -> list[tuple[str, str]]:
    """Reports of every link and observation kind, and verdicts, as (field, json)."""
    reports = [report_json(i) for i in range(9)]
    reports += [
        report_json(9, status="failed", success=False, failure_kind="cancelled", quality=None),
        report_json(10, bandwidth_Bps=0.0, started_at_s=1_699_999_000.25),
        report_json(11, bytes_sent=0, rtt_s=None),  # no transmission: no link row
        report_json(12, group="gv", status="failed", success=False, failure_kind="network",
                    quality=None, lost=True, rtt_s=None, bandwidth_Bps=None),
    ]  # fmt: skip
    verdicts = [verdict_json("g0"), verdict_json("g1", state="all_failed", winner_member=None)]
    return [("report", rep) for rep in reports] + [("verdict", v) for v in verdicts]


def push_fields(r: redis.Redis, entries: list[tuple[str, str]]) -> None:
    pipe = r.pipeline(transaction=False)
    for name, payload in entries:
        pipe.xadd(keys.TRACES, {name: payload})
    pipe.execute()


def test_the_fast_way_and_the_merge_store_the_same_rows(
    r: redis.Redis, pool: ConnectionPool, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    s = settings()
    Harvester(r, pool, s, "h1").run_once()  # the group exists before the entries
    push_fields(r, mixed_entries())
    with caplog.at_level(logging.INFO, "coordinator.tracestore.harvester"):
        assert Harvester(r, pool, s, "h1").run_once() == 13 + 2
    assert not any("merged instead" in rec.getMessage() for rec in caplog.records)
    fast = snapshot(db)
    assert len(fast["members"]) == 13 and len(fast["links"]) == 11
    with psycopg.connect(db) as conn:
        conn.execute("TRUNCATE members, invocations")
    # The same entries again, read before by this consumer: a restart merges them.
    push_fields(r, mixed_entries())
    r.xreadgroup(s.harvest_group, "h2", {keys.TRACES: ">"}, count=100)
    assert Harvester(r, pool, s, "h2").run_once() == 15
    assert snapshot(db) == fast
    assert metrics(r)["harvest_rows"] == 26 and metrics(r)["harvest_verdicts"] == 4


def test_a_fresh_batch_holding_a_stored_or_repeated_member_is_merged(
    r: redis.Redis, pool: ConnectionPool, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    h = Harvester(r, pool, settings(), "h1")
    h.run_once()
    push(r, [report_json(i) for i in range(6)])
    assert h.run_once() == 6
    # First deliveries, yet one member repeats inside the batch and one is stored: the
    # COPY's unique violation rolls back, and the merge stores the rest once.
    push(r, [report_json(6), report_json(7), report_json(6), report_json(2), report_json(8)])
    with caplog.at_level(logging.INFO, "coordinator.tracestore.harvester"):
        assert h.run_once() == 3
    assert any("merged instead" in rec.getMessage() for rec in caplog.records)
    assert scalar(db, "SELECT count(*) FROM members") == 9
    assert scalar(db, "SELECT count(*) FROM link_observations") == 9
    assert scalar(db, "SELECT sum(members) FROM invocations") == 9
    assert scalar(db, "SELECT members FROM invocations WHERE group_id = 'g2'") == 3
    assert metrics(r)["harvest_duplicates"] == 2
    assert r.xlen(keys.TRACES) == 0


def test_run_pipelines_batches_and_acknowledges_every_one(
    r: redis.Redis, pool: ConnectionPool, db: str
) -> None:
    n = 2500
    s = settings(harvest_batch=300)
    push(r, [report_json(i) for i in range(n)])
    stop = threading.Event()
    thread = threading.Thread(target=Harvester(r, pool, s, "h1").run, args=(stop,))
    thread.start()
    try:
        wait_for("every entry stored", lambda: r.xlen(keys.TRACES) == 0, 30)
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()
    assert r.xpending(keys.TRACES, s.harvest_group)["pending"] == 0
    assert scalar(db, "SELECT count(*) FROM members") == n
    assert scalar(db, "SELECT sum(members) FROM invocations") == n
    m = metrics(r)
    assert m["harvest_rows"] == n and m["harvest_entries"] == n
    assert m.get("harvest_duplicates", 0) == 0


# Unix seconds past Postgres' last timestamp (294276 AD) whose microseconds since 2000
# still fit a bigint: the server refuses them.
PAST_PG = 9_224_318_300_000.0


def test_rows_no_column_can_hold_are_dead_lettered_and_the_rest_stored(
    r: redis.Redis, pool: ConnectionPool, db: str
) -> None:
    h = Harvester(r, pool, settings(), "h1")
    h.run_once()
    ids = push(r, [
        report_json(0),
        report_json(1, started_at_s=1e13, finished_at_s=1e13),  # past int8 microseconds
        report_json(2, started_at_s=PAST_PG, finished_at_s=PAST_PG),  # past timestamptz
        report_json(3, bytes_sent=2**70),  # past bigint
        report_json(4),
    ])  # fmt: skip
    verdict = r.xadd(keys.TRACES, {"verdict": verdict_json("g9", planned=2**40)}).decode()
    assert h.run_once() == 2
    assert scalar(db, "SELECT count(*) FROM members") == 2
    dead = {f[b"id"].decode(): f[b"error"].decode() for _, f in r.xrange(keys.TRACES_DEAD)}
    assert set(dead) == {*ids[1:4], verdict}
    assert "rejected by the client" in dead[ids[1]] and "int" in dead[ids[1]]
    assert "rejected by postgres" in dead[ids[2]] and "out of range" in dead[ids[2]]
    assert "rejected by the client" in dead[ids[3]]
    assert "rejected by postgres" in dead[verdict]  # planned: integer out of range
    assert metrics(r)["harvest_dead_letter"] == 4 and r.xlen(keys.TRACES) == 0
