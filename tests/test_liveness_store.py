"""Lost members on real Redis and Postgres (issue 8): the coordinator's record of a member
that never started or never reported is counted once, online and in the recompute; the
check at a kept member's start timeout, on Redis and in memory."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from psycopg_pool import ConnectionPool
from runtime_helpers import trace_count

from coordinator.config import HacoSettings
from coordinator.core.evidence import link_id
from coordinator.core.params import ProfileSettings
from coordinator.core.patience import GaveUp
from coordinator.runtime.liveness import (
    COORDINATOR,
    WORKER,
    Lost,
    LostRecorder,
    claim,
    outcome_key,
    start_key,
)
from coordinator.runtime.ports import RuntimeStore
from coordinator.state.store import RedisStore
from coordinator.tracestore.db import connect
from coordinator.tracestore.harvester import Harvester
from coordinator.tracestore.profilesql import aggregate
from schemas.enums import FailureKind, MemberStatus
from schemas.models import MemberTrace

SETTINGS = HacoSettings(harvest_batch=500, harvest_block_ms=20, profile_ttl_s=600.0)


def base(member: str, cand: str, zone: str, at: float) -> MemberTrace:
    return MemberTrace(
        invocation_id="g", group_id="g", member_id=member, candidate_id=cand, role="coder",
        model="m", zone=zone, caller_zone="eu", rank=0, u_plus=0.5, r_minus=0.2,
        started_at_s=at, finished_at_s=at, status=MemberStatus.TIMED_OUT,
        failure_kind=FailureKind.TIMEOUT, success=False, latency_s=0.0,
    )  # fmt: skip


def lost(member: str, cand: str, zone: str, started: bool, at: float) -> Lost:
    why = GaveUp.NO_REPORT if started else GaveUp.NOT_STARTED
    trace = base(member, cand, zone, at)
    return Lost(member, "g", at, started, why, at + 2.0, at + 10.0, lambda: trace)


def test_claims_decide_who_records_a_member(r: redis.Redis) -> None:
    store = RedisStore(r)
    # The coordinator declared g.0 not started: its worker loses the start race.
    assert claim(store, start_key("g.0"), COORDINATOR, 60.0)
    assert not claim(store, start_key("g.0"), WORKER, 60.0)
    # g.1's worker started first: the coordinator learns it started after all.
    assert claim(store, start_key("g.1"), WORKER, 60.0)
    assert not claim(store, start_key("g.1"), COORDINATOR, 60.0)
    # Its outcome is recorded by whoever claims first, once.
    assert claim(store, outcome_key("g.1"), WORKER, 60.0)
    assert not claim(store, outcome_key("g.1"), COORDINATOR, 60.0)
    assert all(0 < r.pttl(k) <= 60_000 for k in r.scan_iter("haco:idem:*"))


def test_lost_members_survive_the_recompute(r: redis.Redis, pool: ConnectionPool, db: str) -> None:
    cfg = ProfileSettings()
    store = RedisStore(r, cfg)
    rec = LostRecorder(store, SETTINGS, cfg, time.time)
    now = time.time()
    try:
        assert rec.record(lost("g.0", "dark-0", "us", started=False, at=now), now + 2.0) is (
            FailureKind.NETWORK
        )
        assert rec.record(lost("g.1", "hung-0", "eu", started=True, at=now), now + 10.0) is (
            FailureKind.TIMEOUT
        )
        # The hung member's worker finishes later: its claim is taken, nothing is counted.
        assert not claim(store, outcome_key("g.1"), WORKER, 60.0)
        # A member whose worker reported first is not recorded by the coordinator.
        assert claim(store, outcome_key("g.2"), WORKER, 60.0)
        assert rec.record(lost("g.2", "hung-0", "eu", started=True, at=now), now) is None
    finally:
        rec.close()
    online_c, online_l = store.load_profiles(["dark-0", "hung-0"], [link_id("eu", "us")])
    assert online_c["dark-0"].f_int == 0.0 and online_c["dark-0"].delivered == 0.0
    assert online_l[link_id("eu", "us")].loss_rate == 1.0
    assert online_c["hung-0"].f_int == 1.0 and online_c["hung-0"].calls == 1.0
    # Harvested into Postgres, the recompute reads the same evidence.
    h = Harvester(r, pool, SETTINGS, "h")
    while h.run_once():
        pass
    last = r.xinfo_stream("haco:traces")["last-generated-id"].decode()
    ts = lambda at: datetime.fromtimestamp(at, UTC)  # noqa: E731
    with connect(db) as conn:
        conn.autocommit = True
        cands, links = aggregate(conn, last, ts(now - 3600), ts(now + 3600), cfg)
    for cid in ("dark-0", "hung-0"):
        for f in ("calls", "delivered", "internal_failures", "network_failures"):
            got: Any = getattr(cands[cid], f)
            assert got == getattr(online_c[cid], f), (cid, f)
    lk = links[link_id("eu", "us")]
    assert (lk.transmissions, lk.losses) == (1.0, 1.0)


@pytest.mark.parametrize(
    ("worker_claims", "recorded", "left_for_deadline"),
    [
        ((), 1, 0),  # never started: declared not started, recorded lost at once
        (("start",), 0, 1),  # started, no report yet: checked again at its deadline
        (("start", "outcome"), 0, 0),  # started and reported: nothing left to check
    ],
)
def test_a_kept_member_at_its_start_timeout(
    store: RuntimeStore, worker_claims: tuple[str, ...], recorded: int, left_for_deadline: int
) -> None:
    rec = LostRecorder(store, SETTINGS, ProfileSettings(), time.time)
    try:
        for kind in worker_claims:
            key = start_key("g.1") if kind == "start" else outcome_key("g.1")
            assert claim(store, key, WORKER, 60.0)
        trace = base("g.1", "c1", "us", 1.0)
        kept = Lost("g.1", "g", 1.0, False, None, 3.0, time.time() + 600, lambda: trace)
        rec.at_start_timeout(kept)
        assert trace_count(store) == recorded
        assert rec.deferred.pending() == left_for_deadline
        # Whoever holds the start and the outcome, the check took neither from its worker.
        for kind in worker_claims:
            key = start_key("g.1") if kind == "start" else outcome_key("g.1")
            assert not claim(store, key, COORDINATOR, 60.0)
    finally:
        rec.close()


def test_claim_and_peek_claims_one_key_and_only_looks_at_the_other(store: RuntimeStore) -> None:
    assert store.claim_and_peek("a", "x", 60.0, "b") == ("x", False)
    assert store.claim_and_peek("a", "y", 60.0, "b") == ("x", False)  # held: its holder
    assert store.claim_idempotency("b", "z", 60.0) == "z"  # the peek claimed nothing
    assert store.claim_and_peek("c", "y", 60.0, "b") == ("y", True)
