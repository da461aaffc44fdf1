"""Co-failure evidence through the trace store: the recompute folds the stored groups
exactly as the pure fold does, publishes them with the snapshot, and the runtime store
reads them back (issue 10, item 2)."""

from __future__ import annotations

import math
import random
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import redis
from psycopg_pool import ConnectionPool
from test_recompute import drain, hsettings, make_trace, record

from coordinator.core import domains
from coordinator.core.cofailure import CoFailure, Member, dependence, failure_score, fold_groups
from coordinator.core.observations import NOT_OBSERVED, succeeded
from coordinator.core.params import DecayUnit, ProfileSettings
from coordinator.errors import DatabaseError, InputError
from coordinator.state.memstore import MemoryStore
from coordinator.state.store import RedisStore
from coordinator.tracestore.cofailuresql import BATCH_MEMBERS, aggregate_cofailure
from coordinator.tracestore.db import connect
from coordinator.tracestore.harvester import Harvester
from coordinator.tracestore.recompute import recompute
from schemas.models import MemberTrace

CANDS = ["c0", "c1", "c2", "c3"]


def groups_of_traces(
    n: int, seed: int, now: float, ties_and_retries: bool = False, step_s: float = 1.0,
    prefixes: str = "g",
) -> list[list[MemberTrace]]:  # fmt: skip
    """Groups completing ``step_s`` apart, ids of the ``prefixes`` in turn. With
    ``ties_and_retries`` they complete three at a time (folded in group id order, g10
    before g9) and a member is sometimes retried (the same outcome twice)."""
    rng = random.Random(seed)
    groups = []
    for g in range(n):
        members = rng.sample(CANDS, rng.randint(1, 3))
        done = now + (g // 3 if ties_and_retries else g) * step_s
        gid = f"{prefixes[g % len(prefixes)]}{g}"
        group = []
        for k, cand in enumerate(members):
            t = make_trace(g, cand, rng, done - 0.1 * k)
            update = {"member_id": f"{gid}.{k}", "rank": k, "group_id": gid, "invocation_id": gid}
            group.append(t.model_copy(update=update))
        if ties_and_retries and rng.random() < 0.3:
            group.append(group[0].model_copy(update={"member_id": f"g{g}.r"}))
        groups.append(group)
    return groups


def expected(groups: list[list[MemberTrace]], cfg: ProfileSettings) -> CoFailure:
    folded = []
    for group in groups:
        seen = [t for t in group if t.failure_kind not in NOT_OBSERVED]
        if len({t.candidate_id for t in seen}) < 2:
            continue
        outcomes = [
            (t.candidate_id, failure_score(succeeded(t.failure_kind), t.quality)) for t in seen
        ]
        folded.append((max(t.finished_at_s for t in seen), sorted(outcomes), group[0].group_id))
    folded.sort(key=lambda x: (x[0], x[2]))
    return fold_groups(CoFailure(), [(o, at) for at, o, _ in folded], cfg)


@pytest.mark.parametrize(
    ("cfg", "ties_and_retries"),
    [
        (ProfileSettings(), False),
        (ProfileSettings(half_life=40.0), False),
        (ProfileSettings(half_life=4.0), True),
        (ProfileSettings(half_life=30.0, decay_unit=DecayUnit.SECONDS), True),
    ],
)
@pytest.mark.parametrize("two_connections", [False, True])
def test_the_recompute_publishes_the_folded_co_failure_evidence(
    r: redis.Redis, pool: ConnectionPool, db: str, cfg: ProfileSettings, ties_and_retries: bool,
    two_connections: bool,
) -> None:  # fmt: skip
    now = time.time()
    store = RedisStore(r, cfg)
    assert store.load_cofailure() is None  # no snapshot yet
    groups = groups_of_traces(150, 3, now, ties_and_retries)
    for group in groups:
        for t in group:
            record(store, t, cfg)
    drain(Harvester(r, pool, hsettings(), "h"))
    with connect(db) as conn, connect(db) as other:
        result = recompute(r, conn, hsettings(), cfg, other if two_connections else None)
        assert result.adopted
        stored: Any = conn.execute(
            "SELECT cofailure FROM profile_snapshots WHERE version = %s", [result.version]
        ).fetchone()
    want = expected(groups, cfg)
    got = store.load_cofailure()
    assert got is not None and stored is not None and len(stored[0]) == len(want.pairs)
    assert sorted(got.pairs) == sorted(want.pairs) and want.pairs
    for key, p in want.pairs.items():
        q = got.pairs[key]
        assert (q.n, q.s_a, q.s_b, q.s_ab, q.observations) == pytest.approx(
            (p.n, p.s_a, p.s_b, p.s_ab, p.observations), rel=1e-6
        )
    # A second read with the same snapshot version is the cached value.
    assert store.load_cofailure() is got
    assert store.load_domains() == {}  # no pool named: no failure domains published


def test_the_recompute_publishes_the_failure_domains_of_the_pools_it_is_given(
    r: redis.Redis, pool: ConnectionPool, db: str
) -> None:
    cfg, now = ProfileSettings(), time.time()
    store = RedisStore(r, cfg)
    assert store.load_domains() == {}  # no snapshot yet
    for group in groups_of_traces(300, 5, now):
        for t in group:
            record(store, t, cfg)
    drain(Harvester(r, pool, hsettings(), "h"))
    pools = [
        [Member(c, f"z{i % 2}", "m") for i, c in enumerate(CANDS)],
        [Member(c, "z", f"m{i}", "api") for i, c in enumerate(CANDS[::-1])],
        [Member("nobody", "z", "m")],
    ]
    with connect(db) as conn:
        assert recompute(r, conn, hsettings(), cfg, pools=pools).adopted
    evidence = store.load_cofailure()
    assert evidence is not None and evidence.pairs
    got = store.load_domains()
    assert got == {domains.pool_key(p, cfg): dependence(p, evidence, cfg) for p in pools}
    assert got[domains.pool_key(pools[0], cfg)] is not None
    assert got[domains.pool_key(pools[2], cfg)] is None  # never seen together: the paper's
    assert store.load_domains() is got  # the same snapshot: read once


@pytest.mark.parametrize(
    "cfg",
    [
        ProfileSettings(),
        ProfileSettings(half_life=6.0),
        ProfileSettings(half_life=200.0, decay_unit=DecayUnit.SECONDS),
    ],
)
def test_the_read_folds_batch_by_batch_as_one_fold(
    r: redis.Redis, pool: ConnectionPool, db: str, cfg: ProfileSettings
) -> None:
    """Groups over a quarter of an hour (minutes of completions, read in batches of one
    member and more, of 40 and of the default), completing three at a time, their ids
    tied in code point order, which no database collation need follow ("Z" < "a" < "é")."""
    store = RedisStore(r, cfg)
    groups = groups_of_traces(300, 8, time.time() - 3600, True, step_s=9.0, prefixes="aéZg")
    for group in groups:
        for t in group:
            record(store, t, cfg)
    drain(Harvester(r, pool, hsettings(), "h"))
    want = expected(groups, cfg)
    now = datetime.now(UTC)
    with connect(db) as conn:
        for batch_members in (1, 40, BATCH_MEMBERS):
            got = aggregate_cofailure(conn, "99999999999999-0", now - timedelta(days=1),
                                      now, cfg, batch_members)  # fmt: skip
            assert sorted(got.pairs) == sorted(want.pairs) and want.pairs
            for key, p in want.pairs.items():
                q = got.pairs[key]
                assert (q.observations, q.last_seen_s) == pytest.approx(
                    (p.observations, p.last_seen_s), rel=1e-15
                )
                if math.isinf(cfg.half_life):  # to the bit, as the fold adds them
                    assert (q.n, q.s_a, q.s_b, q.s_ab) == (p.n, p.s_a, p.s_b, p.s_ab)
                else:
                    assert (q.n, q.s_a, q.s_b, q.s_ab) == pytest.approx(
                        (p.n, p.s_a, p.s_b, p.s_ab), rel=1e-9
                    )
        with pytest.raises(InputError, match="batch_members 0; expected at least 1"):
            aggregate_cofailure(conn, "99999999999999-0", now, now, cfg, 0)


def test_the_memory_store_hands_back_what_was_set() -> None:
    store = MemoryStore()
    assert store.load_cofailure() is None
    ev = fold_groups(CoFailure(), [([("a", 1.0), ("b", 0.0)], 1.0)], ProfileSettings())
    store.set_cofailure(ev)
    assert store.load_cofailure() is ev
    assert store.load_domains() == {}
    pools = [[Member("c0", "z", "m"), Member("c1", "z", "m")]]
    published = domains.work_out(pools, ev, ProfileSettings())
    store.set_domains(published)
    assert store.load_domains() is published


def test_a_failed_co_failure_read_fails_the_recompute_which_the_next_one_resumes(
    r: redis.Redis, pool: ConnectionPool, db: str
) -> None:
    cfg = ProfileSettings()
    store = RedisStore(r, cfg)
    groups = groups_of_traces(30, 5, time.time())
    for group in groups:
        for t in group:
            record(store, t, cfg)
    drain(Harvester(r, pool, hsettings(), "h"))
    with connect(db) as conn:
        closed = connect(db)
        closed.close()
        with pytest.raises(DatabaseError, match="recompute failed in the trace store"):
            recompute(r, conn, hsettings(), cfg, closed)
        assert store.load_cofailure() is None  # nothing published
        with connect(db) as other:
            result = recompute(r, conn, hsettings(), cfg, other)
    assert result.adopted and result.resumed  # the lock was released, the seal kept
    got = store.load_cofailure()
    assert got is not None and sorted(got.pairs) == sorted(expected(groups, cfg).pairs)


def test_the_co_failure_connection_must_be_autocommit(r: redis.Redis, db: str) -> None:
    expect = pytest.raises(InputError, match="co-failure read got a connection with autocommit")
    with connect(db) as conn, psycopg.connect(db) as tx, expect:
        recompute(r, conn, hsettings(), ProfileSettings(), tx)
