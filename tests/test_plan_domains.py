"""Plans with failure domains (issue 10's rule, issue 12's cost): a role's view carries
the failure domains of the adopted snapshot's co-failure evidence, worked out once per
snapshot; a plan on it decides with them, as the rule does on a view built afresh.

Both stores: co-failure evidence set in memory, or published in a snapshot in Redis.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import astuple

import numpy as np
import pytest
import redis
from runtime_helpers import ROLE, small_pool

from coordinator.config import HacoSettings
from coordinator.core import domains
from coordinator.core.cofailure import (
    CoFailure,
    Dependence,
    Domain,
    Member,
    dependence,
    failure_score,
    fold_groups,
)
from coordinator.core.domains import Published
from coordinator.core.evidence import PoolMember, build_view
from coordinator.core.joint import domain_table
from coordinator.core.methods import Haco
from coordinator.core.params import PolicyParams, ProfileSettings
from coordinator.core.policy import allocate
from coordinator.core.profiles import CandidateObservation
from coordinator.errors import InputError
from coordinator.runtime.pool import domain_pools, endpoint_host
from coordinator.runtime.viewing import Views
from coordinator.state import epochs, keys
from coordinator.state.memstore import MemoryStore
from coordinator.state.store import RedisStore
from schemas.enums import StopReason

TTL_S = 60.0
PROF = ProfileSettings()
OBS = CandidateObservation(1.0, True, None, 0.9, 0.25, 10, 20)
Publish = Callable[..., None]  # (evidence, published domains or None)


def _evidence(together: float, seed: int) -> CoFailure:
    """2 000 groups of c0, c1 and c2 (one site: the same zone and model): all three fail
    together with probability ``together``, and each alone 10% of the time."""
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(2000):
        down = rng.random() < together
        outcomes = [
            (f"c{i}", failure_score(not (down or rng.random() < 0.1), None)) for i in range(3)
        ]
        groups.append((outcomes, float(g)))
    return fold_groups(CoFailure(), groups, PROF)


@pytest.fixture(params=["memory", "redis"])
def setup(
    request: pytest.FixtureRequest,
) -> Iterator[tuple[MemoryStore | RedisStore, Publish]]:
    if request.param == "memory":
        mem = MemoryStore()

        def set_both(ev: CoFailure, published: Published | None = None) -> None:
            mem.set_cofailure(ev)
            mem.set_domains(published or {})

        yield mem, set_both
        return
    r: redis.Redis = request.getfixturevalue("redis_db")
    store = RedisStore(r)
    version = iter(range(1, 100))

    def publish(ev: CoFailure, published: Published | None = None) -> None:
        # As a recompute adopts its snapshot.
        seal = epochs.seal(r, TTL_S)
        snap = epochs.Snapshot(next(version), seal, {}, {}, cofailure=ev, domains=published)
        assert epochs.publish(r, snap, TTL_S)

    yield store, publish


def _views(store: MemoryStore | RedisStore) -> Views:
    """Views that read the profiles and look for a new snapshot on every plan."""
    settings = HacoSettings(plan_view_fresh_s=0.0)
    now = [1_000.0]

    def clock() -> float:
        now[0] += settings.cofailure_refresh_s
        return now[0]

    return Views(small_pool(3), store, settings, PROF, clock=clock)


def test_plans_decide_with_the_snapshots_domains_worked_out_once_per_snapshot(
    setup: tuple[MemoryStore | RedisStore, Publish],
) -> None:
    store, publish = setup

    def warm() -> None:  # after a snapshot: Redis's profiles are then the snapshot's
        for _ in range(100):
            for i in range(3):
                store.update_candidate(f"c{i}", OBS, PROF, TTL_S)

    pool = small_pool(3)
    views = _views(store)
    params = PolicyParams(tau=0.95)
    rule = Haco(params)

    def afresh(nbytes: float, ev: CoFailure) -> object:
        """The decision on a view built from the store's profiles, nothing reused."""
        cands = pool.candidates(ROLE)
        members = [PoolMember(c.id, c.zone, c.model, endpoint_host(c)) for c in cands]
        read = store.read_for_plan([c.id for c in cands], ["local->local"])
        dep = dependence([Member(*astuple(m)) for m in members], ev, PROF)
        view = build_view(members, "local", read.candidates, read.links, nbytes, PROF, dep)
        return allocate(view.stats, params, dep).members.tolist()

    publish(_evidence(0.3, 1))
    warm()
    _, first, _ = views.view(ROLE, 100.0, None, None)
    _, second, _ = views.view(ROLE, 2500.0, None, None)
    assert first.dependence is not None
    assert {d.name for d in first.dependence.domains if d.shock > 0.1} == {"site:local/scripted"}
    assert second.dependence is first.dependence  # the snapshot's, worked out once
    assert domain_table(second.dependence, 3) is domain_table(first.dependence, 3)
    correlated = rule.choose(first)
    # Shared failures cap P_succ below τ, whatever the set: the whole pool is sent.
    assert correlated.stop is StopReason.TARGET_UNREACHABLE
    assert list(correlated.members) == afresh(100.0, store.load_cofailure() or CoFailure())
    assert list(correlated.members) == [0, 1, 2]
    assert list(rule.choose(second).members) == [0, 1, 2]

    publish(_evidence(0.0, 2))  # the next snapshot: the members fail independently
    warm()
    _, third, _ = views.view(ROLE, 100.0, None, None)
    assert third.dependence is not first.dependence
    independent = rule.choose(third)
    # Two members reach τ again (which two may follow the evidence's noise).
    assert independent.stop is StopReason.TARGET_REACHED and len(independent.members) == 2
    assert list(independent.members) == afresh(100.0, store.load_cofailure() or CoFailure())


def _shared(dep: Dependence | None) -> set[str]:
    """The domains that fail their members together more than one time in ten."""
    return set() if dep is None else {d.name for d in dep.domains if d.shock > 0.1}


def test_a_plan_takes_its_pools_published_domains_over_the_evidence(
    setup: tuple[MemoryStore | RedisStore, Publish],
) -> None:
    store, publish = setup
    views = _views(store)
    (pool,) = domain_pools(small_pool(3))
    # The snapshot's evidence says the three fail together; the domains it publishes for
    # the role's pool, worked out from other evidence, that they do not.
    published = domains.work_out([pool], _evidence(0.0, 2), PROF)
    publish(_evidence(0.3, 1), published)
    _, view, _ = views.view(ROLE, 100.0, None, None)
    assert view.dependence is not None
    assert view.dependence == published[domains.pool_key(pool, PROF)]
    assert _shared(view.dependence) == set()
    # A snapshot that publishes nothing for this pool: its own, from the evidence.
    publish(_evidence(0.3, 3), {domains.pool_key(pool[::-1], PROF): None})
    _, view, _ = views.view(ROLE, 100.0, None, None)
    assert view.dependence == dependence(pool, _evidence(0.3, 3), PROF)
    assert _shared(view.dependence) == {"site:local/scripted"}
    # Published as the paper's rule (no pair seen together): no domains.
    publish(_evidence(0.3, 4), {domains.pool_key(pool, PROF): None})
    _, view, _ = views.view(ROLE, 100.0, None, None)
    assert view.dependence is None


def test_published_domains_for_other_settings_or_naming_other_places_are_not_taken(
    setup: tuple[MemoryStore | RedisStore, Publish],
) -> None:
    store, publish = setup
    views = _views(store)
    (pool,) = domain_pools(small_pool(3))
    evidence = _evidence(0.3, 1)
    own = dependence(pool, evidence, PROF)
    other = ProfileSettings(cofail_prior=PROF.cofail_prior * 10)
    publish(evidence, domains.work_out([pool], _evidence(0.0, 2), other))
    _, view, _ = views.view(ROLE, 100.0, None, None)
    assert view.dependence == own
    beyond = Dependence((Domain("zone:local", (0, 1, 5), 0.5),))  # a pool of 6's places
    publish(evidence, {domains.pool_key(pool, PROF): beyond})
    _, view, _ = views.view(ROLE, 100.0, None, None)
    assert view.dependence == own


def test_a_pool_with_published_domains_never_reads_the_evidence(redis_db: redis.Redis) -> None:
    store = RedisStore(redis_db)
    views = _views(store)
    (pool,) = domain_pools(small_pool(3))
    evidence = _evidence(0.3, 1)
    published = domains.work_out([pool], evidence, PROF)
    seal = epochs.seal(redis_db, TTL_S)
    snap = epochs.Snapshot(1, seal, {}, {}, cofailure=evidence, domains=published)
    assert epochs.publish(redis_db, snap, TTL_S)
    redis_db.hset(keys.PROFILE_SNAPSHOT, epochs.COFAILURE_FIELD, "not the evidence")
    with pytest.raises(InputError, match="co-failure evidence is not the encoded form"):
        store.load_cofailure()
    _, view, _ = views.view(ROLE, 100.0, None, None)
    assert view.dependence == published[domains.pool_key(pool, PROF)]
    assert _shared(view.dependence) == {"site:local/scripted"}


def test_published_domains_that_do_not_decode_leave_the_plan_to_the_evidence(
    redis_db: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    store = RedisStore(redis_db)
    views = _views(store)
    (pool,) = domain_pools(small_pool(3))
    evidence = _evidence(0.3, 1)
    published = domains.work_out([pool], _evidence(0.0, 2), PROF)
    seal = epochs.seal(redis_db, TTL_S)
    snap = epochs.Snapshot(7, seal, {}, {}, cofailure=evidence, domains=published)
    assert epochs.publish(redis_db, snap, TTL_S)
    redis_db.hset(keys.PROFILE_SNAPSHOT, epochs.DOMAINS_FIELD, '{"k": [["zone:a", [1, 0], 0.1]]}')
    with caplog.at_level(logging.WARNING, logger="coordinator.state.store"):
        _, view, _ = views.view(ROLE, 100.0, None, None)
        _, again, _ = views.view(ROLE, 100.0, None, None)
    assert (
        view.dependence
        == dependence(pool, evidence, PROF)
        != published[domains.pool_key(pool, PROF)]
    )
    assert again.dependence is view.dependence
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1  # once per snapshot, not per look
    assert "snapshot v7: published failure domains not taken" in warned[0]
    assert "members [1, 0]" in warned[0]
