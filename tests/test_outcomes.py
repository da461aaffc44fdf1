"""Outcomes as data: a hedge group's verdict travels coordinator -> trace stream ->
harvester -> ``invocations`` (schemas.models.GroupVerdict, migrations/0002_verdicts.sql),
replayable from Postgres, without double counting; and the trace store's enum-like
columns accept exactly the values of schemas/enums.py. Real Redis and Postgres (this
run's own database in each, tests/services.py); the runtime is the in-process one
(ThreadDispatcher, the workers' member code) on the Redis store."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

import psycopg
import pytest
import redis
from psycopg_pool import ConnectionPool
from runtime_helpers import RETURNED, SLOW, ScriptedBackend, Step, invocation, small_pool

from coordinator.config import HacoSettings
from coordinator.errors import AllFailedError, DeadlineError
from coordinator.runtime.coordinator import Coordinator
from coordinator.runtime.dispatch import ThreadDispatcher
from coordinator.runtime.results import InvocationResult
from coordinator.state import keys
from coordinator.state.budget import MemoryBudget
from coordinator.state.cancelwatch import RedisCancelWatcher
from coordinator.state.hedgedelay import MemoryDelayWindow
from coordinator.state.store import RedisStore
from coordinator.tracestore.harvester import Harvester
from schemas.enums import (
    FailureKind,
    GroupState,
    LaunchMode,
    MemberStatus,
    StopReason,
    WinnerMode,
)
from schemas.models import GroupVerdict
from workers.member import MemberContext, execute_member

VERDICT_COLS = (
    "role, state, winner_member, p_success, stop, launch_mode, winner_mode, latency_s, "
    "extract(epoch FROM decided_at), extract(epoch FROM created_at), planned, launched, "
    "succeeded, failed, timed_out, cancelled, running, backups, members, winner_rule, "
    "fallback_reason"
)


class Crash(Exception):
    """Raised by the harvester's after-commit hook: committed, never acknowledged."""


def crash() -> None:
    raise Crash


def hsettings() -> HacoSettings:
    return HacoSettings(harvest_block_ms=20)


def drain(h: Harvester) -> int:
    stored = 0
    while n := h.run_once():
        stored += n
    return stored


def row(db: str, group_id: str) -> dict[str, Any] | None:
    with psycopg.connect(db) as conn:
        got = conn.execute(
            f"SELECT {VERDICT_COLS} FROM invocations WHERE group_id = %s".encode(), [group_id]
        ).fetchone()
    names = [c.strip().split()[-1].rstrip(")") for c in VERDICT_COLS.split(",")]
    return None if got is None else dict(zip(names, got, strict=True))


def scalar(db: str, query: str) -> Any:
    with psycopg.connect(db) as conn:
        got = conn.execute(query.encode()).fetchone()
    return None if got is None else got[0]


def entries(r: redis.Redis) -> list[dict[bytes, bytes]]:
    return [fields for _, fields in r.xrange(keys.TRACES)]


def metrics(r: redis.Redis) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in r.hgetall(keys.METRICS).items()}


class Runtime:
    """The in-process runtime on the Redis store: what a worker and a coordinator write,
    they write to the trace stream the harvester reads."""

    def __init__(self, r: redis.Redis, script: dict[str, Step], **overrides: Any) -> None:
        base: dict[str, Any] = {"default_deadline_s": 3.0, "cancel_poll_s": 0.002}
        settings = HacoSettings(**{**base, **overrides})
        self.store = RedisStore(r)
        self.backend = ScriptedBackend(script)
        delays = MemoryDelayWindow(settings)
        self.cancels = RedisCancelWatcher(r, settings.cancel_watch_idle_s, 0.05)
        ctx = MemberContext(self.store, lambda _t: self.backend, settings, delays)
        ctx.cancels = self.cancels
        pool = small_pool(len(script))
        self.dispatcher = ThreadDispatcher(lambda t: execute_member(t, ctx), pool.zones, 8)
        self.coordinator = Coordinator(
            pool, self.store, self.dispatcher, MemoryBudget(settings), delays, settings,
        )  # fmt: skip

    def invoke(self, **overrides: Any) -> InvocationResult:
        result = self.coordinator.invoke(invocation(**overrides))
        self.backend.log("returned")
        return result

    def close(self) -> None:
        self.dispatcher.close()  # every member done: every trace is in the stream
        self.cancels.close()
        # Pending records of lost members would fire later into the next test's database.
        self.coordinator.close()


def test_a_real_run_ends_with_its_verdict_in_postgres(
    r: redis.Redis, pool: ConnectionPool, db: str
) -> None:
    late = Step(0.005, after=(RETURNED,))  # the losers finish after the verdict
    rt = Runtime(r, {"c0": Step(0.005, ok=False), "c1": Step(0.005), "c2": late})
    try:
        won = rt.invoke()
    finally:
        rt.close()
    failing = Runtime(r, {f"c{i}": Step(0.005, ok=False) for i in range(3)})
    try:
        with pytest.raises(AllFailedError) as failed:
            failing.invoke(launch_mode=LaunchMode.STAGGERED, winner_mode=WinnerMode.BEST)
    finally:
        failing.close()
    slow = Runtime(r, {"c0": Step(SLOW), "c1": Step(SLOW)})
    try:
        with pytest.raises(DeadlineError) as late_info:
            slow.invoke(deadline_s=0.1)
    finally:
        slow.close()
    assert drain(Harvester(r, pool, hsettings(), "h")) == 3 + 3 + 2 + 3  # members + verdicts

    got = row(db, won.group_id)
    assert got is not None
    assert got["role"] == "coder" and got["state"] == GroupState.WON
    assert got["winner_member"] == won.winner_id == f"{won.group_id}.1"
    assert got["p_success"] == won.p_success and got["stop"] == won.stop
    assert (got["launch_mode"], got["winner_mode"]) == (LaunchMode.PARALLEL, WinnerMode.RANKED)
    assert got["latency_s"] == pytest.approx(won.latency_s, abs=1e-6)
    assert got["decided_at"] >= got["created_at"]
    at_verdict = [got[k] for k in ("planned", "launched", "succeeded", "failed", "running")]
    assert at_verdict == [3, 3, 1, 1, 1] and got["members"] == 3  # all three harvested
    assert (got["timed_out"], got["cancelled"], got["backups"]) == (0, 0, 0)
    assert (got["winner_rule"], got["fallback_reason"]) == (WinnerMode.RANKED, None)

    got = row(db, str(failed.value.group_id))
    assert got is not None and got["state"] == GroupState.ALL_FAILED
    assert got["winner_member"] is None and got["winner_mode"] == WinnerMode.BEST
    assert got["launch_mode"] == LaunchMode.STAGGERED
    assert (got["launched"], got["failed"], got["members"]) == (3, 3, 3)

    got = row(db, str(late_info.value.group_id))
    assert got is not None and got["state"] == GroupState.DEADLINE
    assert (got["launched"], got["timed_out"], got["members"]) == (2, 2, 2)  # cancelled, traced
    assert scalar(db, "SELECT count(*) FROM invocations WHERE decided_at IS NULL") == 0


def test_redelivered_verdicts_and_members_count_once(
    r: redis.Redis, pool: ConnectionPool, db: str
) -> None:
    rt = Runtime(r, {"c0": Step(0.005), "c1": Step(0.005, after=(RETURNED,))})
    try:
        won = rt.invoke()
    finally:
        rt.close()
    produced = entries(r)
    assert sum(keys.VERDICT_FIELD.encode() in f for f in produced) == 1
    # Committed, then the process dies before the ack: the entries stay pending ...
    with pytest.raises(Crash):
        Harvester(r, pool, hsettings(), "h", after_commit=crash).run_once()
    before = row(db, won.group_id)
    assert before is not None and before["members"] == 2 and before["state"] == GroupState.WON
    # ... and the same consumer, restarted, reads them again: nothing new.
    assert drain(Harvester(r, pool, hsettings(), "h")) == 0
    assert metrics(r)["harvest_duplicates"] == 3
    # The same entries appended once more (a producer's retry): nothing new either.
    for fields in produced:
        r.xadd(keys.TRACES, fields)  # type: ignore[arg-type]
    assert drain(Harvester(r, pool, hsettings(), "h")) == 0
    assert row(db, won.group_id) == before
    assert scalar(db, "SELECT count(*) FROM members") == 2
    assert scalar(db, "SELECT sum(members) FROM invocations") == 2


def verdict_json(group_id: str, **fields: Any) -> str:
    base: dict[str, Any] = {
        "group_id": group_id, "role": "coder", "state": "won", "winner_member": f"{group_id}.0",
        "p_success": 0.93, "stop": "target_reached", "launch_mode": "parallel",
        "winner_mode": "ranked", "started_at_s": 1.7e9, "decided_at_s": 1.7e9 + 2,
        "latency_s": 2.0, "planned": 2, "launched": 2, "succeeded": 1, "running": 1,
    }  # fmt: skip
    return GroupVerdict.model_validate({**base, **fields}).model_dump_json()


def test_the_first_verdict_of_a_group_is_final(
    r: redis.Redis, pool: ConnectionPool, db: str
) -> None:
    h = Harvester(r, pool, hsettings(), "h")
    r.xadd(keys.TRACES, {keys.VERDICT_FIELD: verdict_json("g1")})
    other = verdict_json("g1", state="all_failed", winner_member=None, succeeded=0, failed=2,
                         running=0, decided_at_s=1.7e9 + 3)  # fmt: skip
    r.xadd(keys.TRACES, {keys.VERDICT_FIELD: other})
    assert drain(h) == 1  # in one batch: the earlier verdict is stored, not the other
    r.xadd(keys.TRACES, {keys.VERDICT_FIELD: other})
    assert drain(h) == 0  # in a later batch: the stored one stays
    got = row(db, "g1")
    assert got is not None and (got["state"], got["winner_member"]) == ("won", "g1.0")
    assert (got["members"], got["succeeded"], got["running"]) == (0, 1, 1)
    assert got["created_at"] == pytest.approx(1.7e9) and got["decided_at"] == pytest.approx(
        1.7e9 + 2
    )
    m = metrics(r)
    assert (m["harvest_verdicts"], m["harvest_duplicates"], m.get("harvest_rows", 0)) == (1, 2, 0)


def test_a_verdict_postgres_rejects_is_dead_lettered_alone(
    r: redis.Redis, pool: ConnectionPool, db: str
) -> None:
    h = Harvester(r, pool, hsettings(), "h")
    good = verdict_json("g2")
    too_big = verdict_json("g3", planned=2**40, launched=2, succeeded=1, running=1)
    ids = [r.xadd(keys.TRACES, {keys.VERDICT_FIELD: v}) for v in (good, too_big, "{nope")]
    assert drain(h) == 1
    assert row(db, "g2") is not None and row(db, "g3") is None
    dead = {f[b"id"]: f[b"error"] for _, f in r.xrange(keys.TRACES_DEAD)}
    assert set(dead) == set(ids[1:]) and b"rejected by postgres" in dead[ids[1]]
    assert r.xlen(keys.TRACES) == 0


# ---------------------------------------------------------------- enums = CHECKs

ENUM_COLUMNS: dict[tuple[str, str], type[StrEnum]] = {
    ("invocations", "state"): GroupState,
    ("invocations", "stop"): StopReason,
    ("invocations", "launch_mode"): LaunchMode,
    ("invocations", "winner_mode"): WinnerMode,
    ("invocations", "winner_rule"): WinnerMode,
    ("members", "status"): MemberStatus,
    ("members", "failure_kind"): FailureKind,
}


def check_values(conn: psycopg.Connection[Any], table: str, name: str) -> set[str]:
    query = (
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE conrelid = %s::regclass AND contype = 'c' AND conname = %s"
    )
    got = conn.execute(query, [table, name]).fetchone()
    assert got is not None, f"no constraint {name} on {table}"
    return set(re.findall(r"'([a-z_]+)'::text", got[0]))


def test_every_enum_column_accepts_exactly_its_enum(db: str) -> None:
    with psycopg.connect(db) as conn:
        for (table, column), enum in ENUM_COLUMNS.items():
            allowed = check_values(conn, table, f"{table}_{column}_check")
            assert allowed == {e.value for e in enum}, (table, column)
        # The verdict constraint names the open states and the winning one.
        named = check_values(conn, "invocations", "invocations_verdict_check")
        open_states = {s.value for s in GroupState if not s.final}
        assert named == open_states | {GroupState.WON.value}
