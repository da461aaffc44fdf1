"""Shared runtime state (coordinator.state.store): every test runs on Redis (this run's own
database, tests/services.py) and on the in-memory store, which must keep the same semantics."""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import reduce
from typing import Any

import pytest
import redis
from polling import wait_for
from redis.backoff import NoBackoff
from redis.retry import Retry

from coordinator.core.params import DecayUnit, ProfileSettings
from coordinator.core.profiles import (
    CandidateObservation,
    CandidateProfile,
    LinkObservation,
    LinkProfile,
    update_candidate,
    update_link,
)
from coordinator.errors import StoreError
from coordinator.runtime.ports import RuntimeStore
from coordinator.state import keys
from coordinator.state.closing import CloseLimits, GroupClose, GroupClosed
from coordinator.state.memstore import MemoryStore
from coordinator.state.store import RedisStore
from schemas.enums import FailureKind, GroupSignal

TTL = 60.0
DECAYING = ProfileSettings(half_life=7.0, decay_unit=DecayUnit.OBSERVATIONS)


@pytest.fixture
def client(redis_db: redis.Redis) -> redis.Redis:
    return redis_db  # bytes in, bytes out, as RedisStore requires


@pytest.fixture(params=["redis", "memory"])
def store(request: pytest.FixtureRequest) -> RuntimeStore:
    if request.param == "redis":
        return RedisStore(request.getfixturevalue("client"))
    return MemoryStore()


def traces(store: RuntimeStore) -> list[str]:
    if isinstance(store, MemoryStore):
        return list(store.traces)
    assert isinstance(store, RedisStore)
    entries: list[tuple[bytes, dict[bytes, bytes]]] = store.r.xrange(keys.TRACES)  # type: ignore[assignment]
    return [fields[b"report"].decode() for _, fields in entries]


def observations() -> list[CandidateObservation]:
    return [
        CandidateObservation(
            at_s=1.0, delivered=True, quality=0.7, proc_latency_s=0.4, tokens_in=12, tokens_out=30
        ),
        CandidateObservation(at_s=2.0, delivered=True, failure=FailureKind.INTERNAL),
        CandidateObservation(at_s=3.0, delivered=False, failure=FailureKind.NETWORK),
        CandidateObservation(
            at_s=4.0, delivered=True, quality=0.35, proc_latency_s=1.3, tokens_in=9, tokens_out=8
        ),
        CandidateObservation(at_s=5.0, delivered=False, failure=FailureKind.DEADLINE),
    ]


def link_batches() -> list[list[LinkObservation]]:
    return [
        [LinkObservation(1.0, 800.0, False, 0.01, 0.03), LinkObservation(1.1, 90.0, True)],
        [LinkObservation(2.0, 1200.0, False, 0.02, 0.05)],
    ]


# ---------------------------------------------------------------- group state


def test_group_state_open_get_set(store: RuntimeStore) -> None:
    store.open_group("g1", TTL)
    assert store.group_state("g1") is GroupSignal.OPEN
    store.set_group_state("g1", GroupSignal.RESOLVED, TTL)
    assert store.group_state("g1") is GroupSignal.RESOLVED
    store.set_group_state("g1", GroupSignal.CANCELLED, TTL)
    assert store.group_state("g1") is GroupSignal.CANCELLED
    assert store.group_state("g2") is None  # other groups are untouched


def test_unknown_group_has_no_state(store: RuntimeStore) -> None:
    assert store.group_state("never-opened") is None


# ---------------------------------------------------------------- replies


def test_replies_pop_in_push_order(store: RuntimeStore) -> None:
    for report in ("first", "second", "third"):
        store.push_reply("g", report, TTL)
    assert [store.pop_reply("g", 0.05) for _ in range(3)] == ["first", "second", "third"]


def test_pop_reply_times_out_with_none(store: RuntimeStore) -> None:
    assert store.pop_reply("g", 0.05) is None
    assert store.pop_reply("g", 0.0) is None  # no wait at all
    store.push_reply("other", "not yours", TTL)
    assert store.pop_reply("g", 0.05) is None  # replies are per group


def test_pop_reply_wakes_for_a_reply_pushed_while_waiting(store: RuntimeStore) -> None:
    pusher = threading.Timer(0.02, lambda: store.push_reply("g", "late", TTL))
    pusher.start()
    try:
        assert store.pop_reply("g", 5.0) == "late"
    finally:
        pusher.join()


# ---------------------------------------------------------------- claims


def test_winner_is_claimed_exactly_once(store: RuntimeStore) -> None:
    assert store.claim_winner("g", "g.1", TTL) is True
    assert store.claim_winner("g", "g.0", TTL) is False
    assert store.claim_winner("g", "g.1", TTL) is False  # SET NX: a claim happens once
    assert store.claim_winner("h", "h.0", TTL) is True  # per group


def test_winner_claim_races_have_one_winner(store: RuntimeStore) -> None:
    barrier = threading.Barrier(8)
    wins: list[str] = []

    def claim(i: int) -> None:
        barrier.wait()
        if store.claim_winner("race", f"race.{i}", TTL):
            wins.append(f"race.{i}")

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1


def test_idempotency_claim_returns_the_first_holder_to_everyone(store: RuntimeStore) -> None:
    assert store.claim_idempotency("pay-42", "g.2", TTL) == "g.2"
    assert store.claim_idempotency("pay-42", "g.0", TTL) == "g.2"
    assert store.claim_idempotency("pay-42", "g.2", TTL) == "g.2"
    assert store.claim_idempotency("pay-43", "g.0", TTL) == "g.0"


LIMITS = CloseLimits(TTL, TTL, 1000, TTL)


def close(group: str, winner: str | None, verdict: str, **counts: int) -> GroupClose:
    return GroupClose(group, GroupSignal.RESOLVED, winner, counts, verdict)


def verdicts(store: RuntimeStore) -> list[str]:
    if isinstance(store, MemoryStore):
        return list(store.verdicts)
    assert isinstance(store, RedisStore)
    entries: list[tuple[bytes, dict[bytes, bytes]]] = store.r.xrange(keys.TRACES)  # type: ignore[assignment]
    field = keys.VERDICT_FIELD.encode()
    return [fields[field].decode() for _, fields in entries if field in fields]


def test_a_group_closes_once_and_keeps_its_first_outcome(store: RuntimeStore) -> None:
    store.open_group("g", TTL)
    assert store.close_group(close("g", "g.1", "v1", invocations=1), LIMITS) == GroupClosed(
        True, "g.1"
    )
    again = GroupClose("g", GroupSignal.CANCELLED, "g.0", {"invocations": 1}, "v2")
    assert store.close_group(again, LIMITS) == GroupClosed(False, "g.1")  # nothing written
    assert store.group_state("g") is GroupSignal.RESOLVED
    assert store.metrics() == {"invocations": 1}
    assert verdicts(store) == ["v1"]
    assert store.claim_winner("g", "g.2", TTL) is False
    # Closed without a winner: a later close with one is refused all the same.
    assert store.close_group(close("h", None, "v3"), LIMITS) == GroupClosed(True, None)
    assert store.close_group(close("h", "h.0", "v4"), LIMITS) == GroupClosed(False, None)
    # Claimed by another process first: its winner holds, nothing of this close lands.
    assert store.claim_winner("k", "k.3", TTL)
    assert store.close_group(close("k", "k.0", "v5", invocations=1), LIMITS) == GroupClosed(
        False, "k.3"
    )
    assert verdicts(store) == ["v1", "v3"] and store.metrics() == {"invocations": 1}
    if isinstance(store, RedisStore):  # state, winner, metrics, the stream: all expire
        names = store.r.keys("*")
        assert len(names) == 7 and all(store.r.pttl(k) > 0 for k in names)


def test_racing_closes_have_one_outcome(store: RuntimeStore) -> None:
    barrier = threading.Barrier(8)
    results: list[GroupClosed] = []

    def run(i: int) -> None:
        barrier.wait()
        results.append(store.close_group(close("race", f"race.{i}", f"v{i}", n=1), LIMITS))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    applied = [r for r in results if r.applied]
    assert len(applied) == 1 and store.metrics() == {"n": 1}
    assert {r.winner_member for r in results} == {applied[0].winner_member}
    assert verdicts(store) == [f"v{applied[0].winner_member[5:]}"]  # type: ignore[index]


# ---------------------------------------------------------------- profiles


def test_missing_profiles_load_as_absent(store: RuntimeStore) -> None:
    assert store.load_profiles(["nobody"], ["local->global"]) == ({}, {})
    assert store.load_profiles([], []) == ({}, {})


def test_profiles_round_trip_equal_to_the_pure_updates(store: RuntimeStore) -> None:
    for obs in observations():
        store.update_candidate("cand-a", obs, DECAYING, TTL)
    for batch in link_batches():
        store.update_link("local->global", "local", "global", batch, DECAYING, TTL)
    store.update_candidate("cand-b", observations()[0], DECAYING, TTL)

    cands, links = store.load_profiles(
        ["cand-a", "cand-b", "cand-c"], ["local->global", "local->local"]
    )

    want_a = reduce(
        lambda p, o: update_candidate(p, o, DECAYING), observations(), CandidateProfile("cand-a")
    )
    want_b = update_candidate(CandidateProfile("cand-b"), observations()[0], DECAYING)
    flat = [o for batch in link_batches() for o in batch]
    want_link = reduce(
        lambda p, o: update_link(p, o, DECAYING), flat, LinkProfile("local", "global")
    )
    assert cands == {"cand-a": want_a, "cand-b": want_b}
    assert links == {"local->global": want_link}
    assert cands["cand-a"].calls < 5  # the decay really ran (half-life 7 observations)


def test_concurrent_profile_updates_lose_nothing(store: RuntimeStore) -> None:
    threads, per_thread = 8, 25
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []
    obs = CandidateObservation(at_s=1.0, delivered=True, quality=0.5, proc_latency_s=0.1)
    link_obs = [LinkObservation(1.0, 100.0, False, 0.001, 0.002)]

    def work() -> None:
        try:
            barrier.wait()
            for _ in range(per_thread):
                store.update_candidate("hot", obs, ProfileSettings(), TTL)
                store.update_link(
                    "local->local", "local", "local", link_obs, ProfileSettings(), TTL
                )
        except BaseException as exc:  # surfaced below, not lost in the thread
            errors.append(exc)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert errors == []
    cands, links = store.load_profiles(["hot"], ["local->local"])
    assert cands["hot"].calls == threads * per_thread
    assert cands["hot"].observations == threads * per_thread
    assert cands["hot"].alpha == pytest.approx(1.0 + 0.5 * threads * per_thread)
    assert links["local->local"].transmissions == threads * per_thread


# ---------------------------------------------------------------- traces and metrics


def test_append_trace_keeps_order(store: RuntimeStore) -> None:
    assert traces(store) == []
    for report in ('{"n":1}', '{"n":2}', '{"n":3}'):
        store.append_trace(report, 1000, TTL)
    assert traces(store) == ['{"n":1}', '{"n":2}', '{"n":3}']


def test_metrics_accumulate(store: RuntimeStore) -> None:
    assert store.metrics() == {}
    store.incr_metrics({"invocations": 1, "hedged": 1}, TTL)
    store.incr_metrics({"invocations": 1, "backups": 3}, TTL)
    assert store.metrics() == {"invocations": 2, "hedged": 1, "backups": 3}


def test_cooldowns_name_the_cooling_candidates_and_keep_the_longer(store: RuntimeStore) -> None:
    assert store.cooling([]) == set() and store.cooling(["a", "b"]) == set()
    store.set_cooldown("a", 300.0, 1300.0)
    store.set_cooldown("a", 0.2, 1000.2)  # shorter: the longer one stays
    assert store.cooling(["a", "b", "c"]) == {"a"}


def test_a_memory_cooldown_expires_on_its_clock() -> None:
    now = [100.0]
    store = MemoryStore(clock=lambda: now[0])
    store.set_cooldown("a", 7.0, 107.0)
    now[0] = 106.9
    assert store.cooling(["a"]) == {"a"}
    now[0] = 107.0
    assert store.cooling(["a"]) == set()


def test_a_redis_cooldown_is_a_key_with_the_retry_after_as_its_ttl(client: redis.Redis) -> None:
    store = RedisStore(client)
    store.set_cooldown("a", 300.0, 1300.0)
    assert 299_000 < client.pttl(keys.cooldown("a")) <= 300_000
    store.set_cooldown("a", 600.0, 1600.0)  # longer: it replaces the shorter one
    assert client.pttl(keys.cooldown("a")) > 300_000
    store.set_cooldown("b", 0.05, 0.0)
    wait_for("the short cooldown to expire", lambda: store.cooling(["a", "b"]) == {"a"}, 10.0)


# ---------------------------------------------------------------- Redis only


def test_every_redis_key_has_a_ttl(client: redis.Redis) -> None:
    store = RedisStore(client)
    store.open_group("g", TTL)
    store.set_group_state("g", GroupSignal.RESOLVED, TTL)
    store.push_reply("g", "a", TTL)
    store.push_reply("g", "b", TTL)
    store.pop_reply("g", 0.05)
    store.claim_winner("g", "g.0", TTL)
    store.claim_idempotency("k", "g.0", TTL)
    store.update_candidate("c", observations()[0], ProfileSettings(), TTL)
    store.update_link("local->global", "local", "global", link_batches()[0], ProfileSettings(), TTL)
    store.append_trace("{}", 1000, TTL)
    store.incr_metrics({"invocations": 1}, TTL)
    names = client.keys("*")
    assert len(names) == 9  # state, replies, winner, idem, 2 profiles, versions, traces, metrics
    assert {k: client.ttl(k) > 0 for k in names} == dict.fromkeys(names, True)


OPERATIONS: list[tuple[str, Callable[[RedisStore], Any]]] = [
    ("open a group", lambda s: s.open_group("g", TTL)),
    ("read a group state", lambda s: s.group_state("g")),
    ("set a group state", lambda s: s.set_group_state("g", GroupSignal.CANCELLED, TTL)),
    ("push a reply", lambda s: s.push_reply("g", "r", TTL)),
    ("wait for a reply", lambda s: s.pop_reply("g", 0.05)),
    ("pop a reply", lambda s: s.pop_reply("g", 0.0)),
    ("claim a winner", lambda s: s.claim_winner("g", "g.0", TTL)),
    ("claim an idempotency key", lambda s: s.claim_idempotency("k", "g.0", TTL)),
    ("load profiles", lambda s: s.load_profiles(["c"], [])),
    ("update a profile", lambda s: s.update_candidate("c", observations()[0], DECAYING, TTL)),
    ("append a trace", lambda s: s.append_trace("{}", 1000, TTL)),
    ("count metrics", lambda s: s.incr_metrics({"x": 1}, TTL)),
    ("read metrics", lambda s: s.metrics()),
    ("set a cooldown", lambda s: s.set_cooldown("c", TTL, 0.0)),
    ("read cooldowns", lambda s: s.cooling(["c"])),
]


@pytest.mark.parametrize(("what", "op"), OPERATIONS, ids=[w for w, _ in OPERATIONS])
def test_dead_redis_raises_store_error_naming_the_operation(
    what: str, op: Callable[[RedisStore], Any]
) -> None:
    dead = redis.Redis(port=1, retry=Retry(NoBackoff(), 0), socket_connect_timeout=0.5)
    try:
        with pytest.raises(StoreError, match=f"redis failed to {what}") as info:
            op(RedisStore(dead))
        assert isinstance(info.value.__cause__, redis.RedisError)
    finally:
        dead.close()
