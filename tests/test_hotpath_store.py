"""The worker's two hot-path writes (coordinator.state.memberops): every semantic test runs
on Redis (the scripts) and on the in-memory store; the Lua profile fold is checked
against the pure Python fold (coordinator.core.profiles) on random observation runs."""

from __future__ import annotations

import math
import random

import pytest
import redis
from runtime_helpers import trace_count

from coordinator.core.params import DecayUnit, ProfileSettings
from coordinator.core.profiles import (
    CandidateObservation,
    CandidateProfile,
    LinkObservation,
    LinkProfile,
    update_candidate,
    update_link_many,
)
from coordinator.runtime.ports import RuntimeStore
from coordinator.state import keys
from coordinator.state.codec import decode_candidate, decode_link
from coordinator.state.hedgedelay import entry_latency
from coordinator.state.memberops import MemberOutcome, MemberStart, OutcomeLimits, Started
from coordinator.state.store import RedisStore
from schemas.enums import FailureKind, GroupSignal

TTL = 60.0
LIMITS = OutcomeLimits(profile_ttl_s=TTL, trace_maxlen=1000, trace_ttl_s=TTL)
INF = ProfileSettings()


def start(group: str = "g", past: bool = False) -> MemberStart:
    return MemberStart(group, f"start:{group}.0", "started:0", "worker", past, TTL)


def outcome(
    group: str = "g",
    harvest: bool = True,
    cand_obs: CandidateObservation | None = None,
    legs: tuple[LinkObservation, ...] = (),
    delay_s: float | None = None,
) -> MemberOutcome:
    return MemberOutcome(
        group, '{"report": 1}', TTL, harvest, f"outcome:{group}.0", "worker", "c1",
        cand_obs, "a->b", "a", "b", legs, "coder", delay_s, 8,
    )  # fmt: skip


def replies(store: RuntimeStore, group: str) -> list[str]:
    out = []
    while (raw := store.pop_reply(group, 0)) is not None:
        out.append(raw)
    return out


def profiles(store: RuntimeStore) -> tuple[CandidateProfile | None, LinkProfile | None]:
    cands, links = store.load_profiles(["c1"], ["a->b"])
    return cands.get("c1"), links.get("a->b")


OBS = CandidateObservation(1.0, True, None, 0.8, 0.25, 10, 20)
LEG = LinkObservation(1.0, 1000.0, False, 0.001, 0.02)


# ---------------------------------------------------------------- start_member


def test_a_member_of_a_group_that_does_not_exist_does_not_start(store: RuntimeStore) -> None:
    assert store.start_member(start()) == (None, Started.NOT_STARTED)
    assert replies(store, "g") == []


def test_a_member_of_a_cancelled_group_does_not_start(store: RuntimeStore) -> None:
    store.set_group_state("g", GroupSignal.CANCELLED, TTL)
    assert store.start_member(start()) == (GroupSignal.CANCELLED, Started.NOT_STARTED)
    assert replies(store, "g") == []


def test_a_member_past_its_deadline_does_not_start_nor_claim(store: RuntimeStore) -> None:
    store.open_group("g", TTL)
    assert store.start_member(start(past=True)) == (GroupSignal.OPEN, Started.NOT_STARTED)
    # Its start was not claimed: the coordinator can still declare it not started.
    assert store.claim_idempotency("start:g.0", "coordinator", TTL) == "coordinator"


def test_a_started_member_claims_its_start_and_says_so(store: RuntimeStore) -> None:
    store.open_group("g", TTL)
    assert store.start_member(start()) == (GroupSignal.OPEN, Started.RUN)
    assert replies(store, "g") == ["started:0"]
    assert store.claim_idempotency("start:g.0", "coordinator", TTL) == "worker"
    # A redelivered task (its worker died) starts again: the claim is its own.
    assert store.start_member(start()) == (GroupSignal.OPEN, Started.RUN)


def test_a_member_declared_lost_never_starts(store: RuntimeStore) -> None:
    store.open_group("g", TTL)
    store.claim_idempotency("start:g.0", "coordinator", TTL)
    assert store.start_member(start()) == (GroupSignal.OPEN, Started.DECLARED_LOST)
    assert replies(store, "g") == []


# ---------------------------------------------------------------- report_member


def test_a_report_without_harvest_is_a_reply_only(store: RuntimeStore) -> None:
    assert store.report_member(outcome(harvest=False, cand_obs=OBS), INF, LIMITS) is False
    assert replies(store, "g") == ['{"report": 1}']
    assert profiles(store) == (None, None)
    assert trace_count(store) == 0


def test_a_report_records_profiles_and_trace_once(store: RuntimeStore) -> None:
    assert store.report_member(outcome(cand_obs=OBS, legs=(LEG,)), INF, LIMITS) is True
    assert replies(store, "g") == ['{"report": 1}']
    cand, link = profiles(store)
    assert cand == update_candidate(CandidateProfile("c1"), OBS, INF)
    assert link == update_link_many(LinkProfile("a", "b"), [LEG], INF)
    assert trace_count(store) == 1


def test_an_outcome_the_coordinator_recorded_is_not_counted_again(store: RuntimeStore) -> None:
    store.claim_idempotency("outcome:g.0", "coordinator", TTL)
    assert store.report_member(outcome(cand_obs=OBS, legs=(LEG,)), INF, LIMITS) is False
    assert replies(store, "g") == ['{"report": 1}']  # the coordinator still hears it
    assert profiles(store) == (None, None)
    assert trace_count(store) == 0


def test_a_report_writes_the_delay_sample_when_the_store_keeps_the_window(
    redis_db: redis.Redis,
) -> None:
    store = RedisStore(redis_db)
    for i in range(10):
        store.report_member(outcome(group=f"g{i}", cand_obs=OBS, delay_s=0.5 + i), INF, LIMITS)
    window = [entry_latency(v) for v in redis_db.lrange(keys.hedge_delay_window("coder"), 0, -1)]
    assert window == [9.5, 8.5, 7.5, 6.5, 5.5, 4.5, 3.5, 2.5]  # newest first, 8 kept
    ranked = redis_db.zrange(keys.hedge_delay_ranked("coder"), 0, -1, withscores=True)
    assert [score for _, score in ranked] == sorted(window)  # the same 8, by latency
    for key in (keys.hedge_delay_window("coder"), keys.hedge_delay_ranked("coder")):
        assert 0 < redis_db.pttl(key) <= TTL * 1000


def test_no_delay_sample_from_an_outcome_that_is_not_the_workers(redis_db: redis.Redis) -> None:
    store = RedisStore(redis_db)
    store.claim_idempotency("outcome:g.0", "coordinator", TTL)  # recorded lost
    assert store.report_member(outcome(cand_obs=OBS, delay_s=0.5), INF, LIMITS) is False
    assert store.report_member(outcome("h", harvest=False, delay_s=0.5), INF, LIMITS) is False
    assert redis_db.llen(keys.hedge_delay_window("coder")) == 0
    assert redis_db.zcard(keys.hedge_delay_ranked("coder")) == 0
    assert replies(store, "g") == replies(store, "h") == ['{"report": 1}']


def test_report_keys_carry_their_ttl(redis_db: redis.Redis) -> None:
    RedisStore(redis_db).report_member(outcome(cand_obs=OBS, legs=(LEG,)), INF, LIMITS)
    for name in redis_db.keys("*"):
        assert redis_db.pttl(name) > 0, name


# ---------------------------------------------------------------- the Lua fold


Run = tuple[CandidateObservation, list[LinkObservation]]


def _random_runs(rng: random.Random, n: int) -> list[Run]:
    kinds = [None, None, None, FailureKind.INTERNAL, FailureKind.NETWORK, FailureKind.DEADLINE]
    t, out = 1000.0, []
    for _ in range(n):
        t += rng.choice([0.0, rng.expovariate(2.0), -rng.random() * 0.1])  # times go back too
        failure = rng.choice(kinds)
        delivered = failure is not FailureKind.NETWORK or rng.random() < 0.5
        obs = CandidateObservation(
            t, delivered, failure,
            quality=rng.random() if failure is None and rng.random() < 0.8 else None,
            proc_latency_s=rng.lognormvariate(0, 1) if rng.random() < 0.9 else None,
            tokens_in=rng.randrange(0, 5000), tokens_out=rng.randrange(0, 5000),
        )  # fmt: skip
        legs = []
        for _ in range(rng.randrange(0, 3)):
            can = rng.random() < 0.8
            lost = can and rng.random() < 0.1
            t_tx = None if rng.random() < 0.1 else rng.uniform(0.0, 0.5)
            rtt = None if rng.random() < 0.2 else rng.uniform(0.001, 0.3)
            legs.append(LinkObservation(t, rng.uniform(100, 1e6), lost, t_tx, rtt, can))
        out.append((obs, legs))
    return out


SETTINGS = {
    "never forgets": ProfileSettings(latency_window=7, bandwidth_window=5),
    "observations": ProfileSettings(half_life=13.0, decay_unit=DecayUnit.OBSERVATIONS),
    "seconds": ProfileSettings(half_life=3.0, decay_unit=DecayUnit.SECONDS, latency_window=5),
}


def _close(a: object, b: object, exact: bool) -> bool:
    if isinstance(a, float | int) and isinstance(b, float | int):
        return a == b if exact else math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-300)
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_close(x, y, exact) for x, y in zip(a, b, strict=True))
    if hasattr(a, "__dataclass_fields__"):
        names = a.__dataclass_fields__
        return all(_close(getattr(a, k), getattr(b, k), exact) for k in names)
    return a == b


@pytest.mark.parametrize("name", list(SETTINGS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_script_fold_is_the_python_fold(redis_db: redis.Redis, name: str, seed: int) -> None:
    settings = SETTINGS[name]
    store = RedisStore(redis_db, settings)
    cand, link = CandidateProfile("c1"), LinkProfile("a", "b")
    for i, (obs, legs) in enumerate(_random_runs(random.Random(seed), 150)):
        store.report_member(outcome(f"g{i}", cand_obs=obs, legs=tuple(legs)), settings, LIMITS)
        cand = update_candidate(cand, obs, settings)
        link = update_link_many(link, legs, settings)
    got_c = decode_candidate(redis_db.get(keys.delta_candidate(0, "c1")) or b"")
    got_l = decode_link(redis_db.get(keys.delta_link(0, "a->b")) or b"")
    # Bit for bit without decay; with it, as close as two libm pow()s allow.
    exact = name == "never forgets"
    assert _close(got_c, cand, exact), (got_c, cand)
    assert _close(got_l, link, exact), (got_l, link)


def test_the_script_folds_onto_a_delta_the_python_writers_left(redis_db: redis.Redis) -> None:
    """A lost member's record (coordinator) and a late judgement still go through the
    WATCH/MULTI writers: the script folds on top of what they wrote, and they on top of it."""
    store = RedisStore(redis_db)
    lost = CandidateObservation(2.0, False, FailureKind.NETWORK)
    store.update_candidate("c1", lost, INF, TTL)
    store.report_member(outcome(cand_obs=OBS), INF, LIMITS)
    store.apply_quality("c1", 0.3, INF, TTL, 3.0)
    want = update_candidate(update_candidate(CandidateProfile("c1"), lost, INF), OBS, INF)
    want_alpha = want.alpha + 0.3
    got = profiles(store)[0]
    assert got is not None
    assert got.calls == 2 and got.alpha == want_alpha and got.network_failures == 1


def test_the_windows_stay_exact_across_the_script_and_the_python_writers(
    redis_db: redis.Redis,
) -> None:
    """The script and the Python writers fold onto each other's MessagePack values; the
    window is the pure fold's, to the bit, whoever wrote last."""
    settings = ProfileSettings(latency_window=3, bandwidth_window=2)
    store = RedisStore(redis_db, settings)
    cand, link = CandidateProfile("c1"), LinkProfile("a", "b")
    for i in range(11):
        obs = CandidateObservation(float(i), True, None, 0.5, 0.1 * (i + 1), 1, 2)
        leg = LinkObservation(float(i), 100.0 * (i + 1), False, 0.01, 0.02)
        if i % 4 == 3:  # a Python writer (a lost member's record): no length beside it
            store.update_candidate("c1", obs, settings, TTL)
            store.update_link("a->b", "a", "b", [leg], settings, TTL)
        else:
            store.report_member(outcome(f"g{i}", cand_obs=obs, legs=(leg,)), settings, LIMITS)
        cand = update_candidate(cand, obs, settings)
        link = update_link_many(link, [leg], settings)
        got_c, got_l = profiles(store)
        assert got_c is not None and got_l is not None
        assert got_c.recent_latency_s == cand.recent_latency_s, i
        assert got_l.recent_bandwidth_Bps == link.recent_bandwidth_Bps, i
    for key in (keys.delta_candidate(0, "c1"), keys.delta_link(0, "a->b")):
        raw = redis_db.get(key) or b"{"
        assert raw[:1] != b"{"  # MessagePack, not JSON


@pytest.mark.parametrize("decay", ["never forgets", "seconds"])
def test_the_script_folds_onto_a_json_value_an_older_version_wrote(
    redis_db: redis.Redis, decay: str
) -> None:
    """A delta left in JSON (before the values were MessagePack) is read, folded and
    written back as MessagePack, as the Python fold would."""
    from coordinator.state.codec import encode

    settings = SETTINGS[decay]
    store = RedisStore(redis_db, settings)
    runs = _random_runs(random.Random(7), 12)
    cand, link = CandidateProfile("c1"), LinkProfile("a", "b")
    for obs, legs in runs[:6]:
        cand = update_candidate(cand, obs, settings)
        link = update_link_many(link, legs, settings)
    redis_db.set(keys.delta_candidate(0, "c1"), encode(cand))
    redis_db.set(keys.delta_link(0, "a->b"), encode(link))
    for i, (obs, legs) in enumerate(runs[6:]):
        store.report_member(outcome(f"g{i}", cand_obs=obs, legs=tuple(legs)), settings, LIMITS)
        cand = update_candidate(cand, obs, settings)
        link = update_link_many(link, legs, settings)
    got_c, got_l = profiles(store)
    exact = decay == "never forgets"
    assert _close(got_c, cand, exact), (got_c, cand)
    assert _close(got_l, link, exact), (got_l, link)
    assert (redis_db.get(keys.delta_candidate(0, "c1")) or b"{")[:1] != b"{"


@pytest.mark.parametrize("size", [0, 3, 10, 256, 9000])  # every str header's length
def test_delta_values_round_trip_as_messagepack(size: int) -> None:
    from coordinator.core.profiles import Moments
    from coordinator.state.codec import encode_delta

    window = tuple(0.1 * i + 1e-3 for i in range(size))
    odd = CandidateProfile(
        "c", alpha=3.0, latency=Moments(2.0, math.inf, 2.0**60), recent_latency_s=window
    )
    assert decode_candidate(encode_delta(odd)) == odd
    link = LinkProfile("a", "b", transmissions=1e20, recent_bandwidth_Bps=window)
    assert decode_link(encode_delta(link)) == link


def test_a_window_written_as_an_array_is_read_and_folded(redis_db: redis.Redis) -> None:
    """A delta whose window is a MessagePack array of numbers (as the first packed values
    were written) reads as the same profile, and the script folds onto it exactly."""
    import msgspec

    settings = ProfileSettings(latency_window=4, bandwidth_window=3)
    runs = _random_runs(random.Random(3), 10)
    cand, link = CandidateProfile("c1"), LinkProfile("a", "b")
    for obs, legs in runs[:5]:
        cand = update_candidate(cand, obs, settings)
        link = update_link_many(link, legs, settings)
    as_array = msgspec.msgpack.encode(cand)
    assert decode_candidate(as_array) == cand
    redis_db.set(keys.delta_candidate(0, "c1"), as_array)
    redis_db.set(keys.delta_link(0, "a->b"), msgspec.msgpack.encode(link))
    store = RedisStore(redis_db, settings)
    for i, (obs, legs) in enumerate(runs[5:]):
        store.report_member(outcome(f"g{i}", cand_obs=obs, legs=tuple(legs)), settings, LIMITS)
        cand = update_candidate(cand, obs, settings)
        link = update_link_many(link, legs, settings)
    got_c, got_l = profiles(store)
    assert _close(got_c, cand, True) and _close(got_l, link, True), (got_c, cand)


def test_a_window_length_beside_a_non_finite_value_is_ignored_by_the_json_path() -> None:
    raw = '{"candidate_id":"c","latency":{"n":1,"s1":Infinity,"s2":Infinity},'
    raw += '"recent_latency_s":[0.5],"recent_latency_s_n":1}'
    got = decode_candidate(raw)
    assert got.recent_latency_s == (0.5,) and got.latency.s1 == math.inf


def test_the_script_folds_into_the_current_epoch(redis_db: redis.Redis) -> None:
    redis_db.set(keys.PROFILE_EPOCH, 4)
    RedisStore(redis_db).report_member(outcome(cand_obs=OBS, legs=(LEG,)), INF, LIMITS)
    assert redis_db.exists(keys.delta_candidate(4, "c1"), keys.delta_link(4, "a->b")) == 2
    assert not redis_db.exists(keys.delta_candidate(0, "c1"))


# ---------------------------------------------------------------- read_for_plan


def _plan_read(store: RuntimeStore, open_group: str | None = None) -> tuple[object, ...]:
    got = store.read_for_plan(["c1", "c2"], ["a->b"], open_group, TTL)
    return got.candidates, got.links, got.cooling


def test_the_plan_read_is_the_profiles_the_cooldowns_and_the_open_group(
    store: RuntimeStore,
) -> None:
    assert _plan_read(store) == ({}, {}, set())
    store.report_member(outcome(cand_obs=OBS, legs=(LEG,)), INF, LIMITS)
    store.set_cooldown("c2", TTL, 1e12)
    cands, links = store.load_profiles(["c1", "c2"], ["a->b"])
    assert _plan_read(store, open_group="g7") == (cands, links, {"c2"})
    assert store.group_state("g7") is GroupSignal.OPEN
    assert store.group_state("g8") is None  # nothing opened unless asked


LOST = CandidateObservation(5.0, False, FailureKind.NETWORK)
WRITES = {
    "a worker's report": lambda s: s.report_member(outcome("h", cand_obs=OBS), INF, LIMITS),
    "a lost member": lambda s: s.update_candidate("c1", LOST, INF, TTL),
    "a late judgement": lambda s: s.apply_quality("c1", 0.1, INF, TTL, 1.0),
    "a link write": lambda s: s.update_link("a->b", "a", "b", [LEG], INF, TTL),
}  # fmt: skip


@pytest.mark.parametrize("write", list(WRITES))
def test_a_cached_profile_is_read_again_after_every_kind_of_write(
    redis_db: redis.Redis, write: str
) -> None:
    reader, writer = (
        RedisStore(redis_db),
        RedisStore(redis.Redis(connection_pool=redis_db.connection_pool)),
    )
    writer.report_member(outcome(cand_obs=OBS, legs=(LEG,)), INF, LIMITS)
    first = _plan_read(reader)
    assert _plan_read(reader) == first  # served from the cache: nothing changed
    WRITES[write](writer)
    assert _plan_read(reader)[:2] == writer.load_profiles(["c1", "c2"], ["a->b"])
    assert _plan_read(reader) != first


def test_a_cached_profile_follows_a_new_epoch_and_a_new_snapshot(redis_db: redis.Redis) -> None:
    reader, writer = RedisStore(redis_db), RedisStore(redis_db)
    writer.report_member(outcome(cand_obs=OBS), INF, LIMITS)
    before = _plan_read(reader)
    redis_db.incr(keys.PROFILE_EPOCH)  # a recompute sealed the epoch: deltas fold in anew
    writer.report_member(outcome("h", cand_obs=OBS), INF, LIMITS)
    after = _plan_read(reader)
    assert after[:2] == writer.load_profiles(["c1", "c2"], ["a->b"])
    cand = after[0]["c1"]  # type: ignore[index]
    assert cand.calls == 2 and before != after
    redis_db.hset(keys.PROFILE_SNAPSHOT, mapping={"version": 3, "epoch": 1})
    assert _plan_read(reader)[:2] == writer.load_profiles(["c1", "c2"], ["a->b"])


def test_a_cached_profile_is_read_again_after_its_max_age(redis_db: redis.Redis) -> None:
    now = [100.0]
    reader = RedisStore(redis_db, view_max_age_s=5.0)
    reader.view_clock = lambda: now[0]
    reader.report_member(outcome(cand_obs=OBS), INF, LIMITS)
    assert "c1" in _plan_read(reader)[0]  # type: ignore[operator]
    redis_db.delete(keys.delta_candidate(0, "c1"))  # expired: no write tells the cache
    assert "c1" in _plan_read(reader)[0]  # type: ignore[operator]
    now[0] += 5.0
    assert _plan_read(reader)[0] == {}


def test_profiles_decode_fast_and_the_json_path_takes_what_msgspec_refuses() -> None:
    from coordinator.core.profiles import Moments
    from coordinator.state.codec import encode

    plain = CandidateProfile("c", calls=3.0, recent_latency_s=(0.5, 1.5), last_seen_s=2.0)
    assert decode_candidate(encode(plain)) == plain
    odd = CandidateProfile("c", latency=Moments(1.0, math.inf, math.inf))  # json's Infinity
    assert decode_candidate(encode(odd)) == odd
    legacy = '{"src":"a","dst":"b","transmissions":2,"observations":2}'  # no window yet
    assert decode_link(legacy) == LinkProfile("a", "b", transmissions=2.0, observations=2)


def test_the_report_script_bench_times_every_part(redis_url: str) -> None:
    from bench import reportscript

    res = reportscript.run(redis_url, n=5, rounds=1)
    assert tuple(res["server_us_per_report"]) == reportscript.CASES
    assert all(v > 0 for v in res["server_us_per_report"].values())
