"""Hedge budget and hedge delay (spec hedging.md): every test runs against Redis (this
run's own database, tests/services.py) and the in-memory store; time comes from an
injected clock, never from sleeping."""

from __future__ import annotations

import math
import multiprocessing
import random
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st
from services import UNREACHABLE_REDIS_URL

from coordinator.config import HacoSettings
from coordinator.core.percentiles import nearest_rank
from coordinator.errors import InputError, StoreError
from coordinator.runtime.ports import DelayWindow, HedgeBudget
from coordinator.state import keys
from coordinator.state.budget import BudgetSnapshot, MemoryBudget, RedisBudget
from coordinator.state.hedgedelay import MemoryDelayWindow, RedisDelayWindow

T0 = 1_700_000_000.0  # an epoch-sized clock value, as time.time() would give


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def client(redis_db: redis.Redis) -> redis.Redis:
    return redis_db


@dataclass
class Backend:
    name: str
    client: redis.Redis | None

    def budget(self, clock: FakeClock, **overrides: Any) -> HedgeBudget:
        settings = HacoSettings(**overrides)
        if self.client is None:
            return MemoryBudget(settings, clock=clock)
        return RedisBudget(self.client, settings, clock=clock)

    def delay(self, **overrides: Any) -> MemoryDelayWindow | RedisDelayWindow:
        settings = HacoSettings(**overrides)
        if self.client is None:
            return MemoryDelayWindow(settings)
        return RedisDelayWindow(self.client, settings)


@pytest.fixture(params=["redis", "memory"])
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "redis":
        return Backend("redis", request.getfixturevalue("client"))
    return Backend("memory", None)


# ---------------------------------------------------------------- budget: request bucket


def test_fresh_budget_allows_burst_backups_then_refuses(backend: Backend) -> None:
    budget = backend.budget(FakeClock(), budget_burst=3, budget_ratio=0.0)
    assert [budget.try_spend(1, 0.0) for _ in range(4)] == [True, True, True, False]


def test_multi_backup_spend_needs_all_tokens(backend: Backend) -> None:
    budget = backend.budget(FakeClock(), budget_burst=3, budget_ratio=0.0)
    assert budget.try_spend(2, 0.0)
    assert not budget.try_spend(2, 0.0)
    assert budget.try_spend(1, 0.0)
    assert budget.snapshot().spent_backups == 3


def test_earn_refills_by_ratio(backend: Backend) -> None:
    budget = backend.budget(FakeClock(), budget_burst=2, budget_ratio=0.05)
    assert budget.try_spend(2, 0.0)
    for _ in range(19):
        budget.earn()
    assert not budget.try_spend(1, 0.0)  # 19 × 0.05 = 0.95 < 1
    budget.earn()
    assert budget.try_spend(1, 0.0)  # the 20th invocation earned one backup
    assert not budget.try_spend(1, 0.0)
    budget.earn(40)  # batch credit: 40 × 0.05 = 2
    assert budget.try_spend(2, 0.0)


def test_earn_caps_at_burst(backend: Backend) -> None:
    budget = backend.budget(FakeClock(), budget_burst=4, budget_ratio=0.5)
    assert budget.try_spend(1, 0.0)
    budget.earn(1000)
    assert budget.snapshot().request_tokens == pytest.approx(4.0)
    assert [budget.try_spend(1, 0.0) for _ in range(5)] == [True] * 4 + [False]


# ---------------------------------------------------------------- budget: LLM bucket


def test_llm_bucket_refills_with_clock_time_and_caps(backend: Backend) -> None:
    clock = FakeClock()
    budget = backend.budget(
        clock,
        budget_burst=100,
        budget_ratio=0.0,
        budget_tokens_per_s=100.0,
        budget_tokens_burst=1000.0,
    )
    assert budget.try_spend(1, 1000.0)
    assert not budget.try_spend(1, 1.0)
    clock.now += 2.5
    assert budget.snapshot().llm_tokens == pytest.approx(250.0)
    assert not budget.try_spend(1, 300.0)
    assert budget.try_spend(1, 250.0)
    assert budget.snapshot().llm_tokens == pytest.approx(0.0)
    clock.now += 3600.0
    assert budget.snapshot().llm_tokens == pytest.approx(1000.0)  # capped at burst
    assert budget.try_spend(1, 1000.0)
    assert not budget.try_spend(1, 0.5)


def test_llm_refill_time_never_moves_backwards(backend: Backend) -> None:
    # A process with a clock behind the others must not earn the gap twice.
    clock = FakeClock()
    budget = backend.budget(
        clock, budget_burst=100, budget_tokens_per_s=10.0, budget_tokens_burst=1000.0
    )
    assert budget.try_spend(1, 1000.0)
    clock.now = T0 - 50.0
    assert not budget.try_spend(1, 1.0)
    clock.now = T0 + 1.0
    assert budget.snapshot().llm_tokens == pytest.approx(10.0)


def test_try_spend_debits_nothing_when_either_bucket_is_short(backend: Backend) -> None:
    budget = backend.budget(
        FakeClock(),
        budget_burst=2,
        budget_ratio=0.0,
        budget_tokens_per_s=1.0,
        budget_tokens_burst=100.0,
    )
    full = BudgetSnapshot(request_tokens=2.0, llm_tokens=100.0, exhausted=0, spent_backups=0)
    assert budget.snapshot() == full
    assert not budget.try_spend(3, 1.0)  # request bucket short, LLM bucket enough
    assert not budget.try_spend(1, 100.5)  # LLM bucket short, request bucket enough
    after = budget.snapshot()
    assert (after.request_tokens, after.llm_tokens) == (2.0, 100.0)
    assert after.spent_backups == 0
    assert after.exhausted == 2


def test_exhaustion_counter_and_snapshot(backend: Backend) -> None:
    clock = FakeClock()
    budget = backend.budget(
        clock,
        budget_burst=2,
        budget_ratio=0.25,
        budget_tokens_per_s=10.0,
        budget_tokens_burst=50.0,
    )
    assert budget.try_spend(1, 20.0)
    assert budget.try_spend(1, 20.0)
    assert not budget.try_spend(1, 1.0)
    assert not budget.try_spend(1, 1.0)
    budget.earn(2)
    clock.now += 1.0
    snap = budget.snapshot()
    assert snap.request_tokens == pytest.approx(0.5)
    assert snap.llm_tokens == pytest.approx(20.0)
    assert snap.exhausted == 2
    assert snap.spent_backups == 2


def test_zero_cost_spend_always_succeeds(backend: Backend) -> None:
    budget = backend.budget(FakeClock(), budget_burst=0, budget_tokens_burst=0)
    assert budget.try_spend(0, 0.0)
    assert not budget.try_spend(1, 0.0)


@pytest.mark.parametrize(
    ("backups", "llm_tokens"),
    [(-1, 0.0), (1.5, 0.0), (True, 0.0), (1, -1.0), (1, math.nan), (1, math.inf), (1, "3")],
)
def test_budget_rejects_bad_spend(backend: Backend, backups: Any, llm_tokens: Any) -> None:
    budget = backend.budget(FakeClock())
    with pytest.raises(InputError, match="must be"):
        budget.try_spend(backups, llm_tokens)
    assert budget.snapshot().exhausted == 0


def test_budget_rejects_bad_earn(backend: Backend) -> None:
    budget = backend.budget(FakeClock())
    with pytest.raises(InputError, match=r"n_requests.*-2"):
        budget.earn(-2)


# ---------------------------------------------------------------- hedge delay


def expected_percentile(values: list[float], percentile: float) -> float:
    """Nearest rank by its definition: the smallest value with at least p% of the
    values at or below it (independent of the ceil formula under test)."""
    n = len(values)
    for v in sorted(values):
        if sum(1 for x in values if x <= v) * 100 >= percentile * n:
            return v
    raise AssertionError("unreachable")


def test_initial_delay_until_min_samples(backend: Backend) -> None:
    window = backend.delay(
        hedge_delay_min_samples=5, initial_hedge_delay_s=0.7, hedge_delay_percentile=95.0
    )
    for i in range(4):
        window.record("coder", 10.0 + i)
        assert window.delay_s("coder") == 0.7
    window.record("coder", 20.0)
    assert window.delay_s("coder") == 20.0
    assert window.delay_s("planner") == 0.7  # roles have separate windows


def test_delay_is_nearest_rank_percentile(backend: Backend) -> None:
    rng = random.Random(7)
    latencies = [round(rng.lognormvariate(0.0, 0.8), 4) for _ in range(40)]
    window = backend.delay(
        hedge_delay_min_samples=20, hedge_delay_window=100, hedge_delay_percentile=95.0
    )
    for value in latencies:
        window.record("coder", value)
    expected = sorted(latencies)[37]  # rank ceil(0.95 × 40) = 38
    assert expected == expected_percentile(latencies, 95.0)
    assert window.delay_s("coder") == expected


def test_delay_with_p95_of_twenty_is_the_nineteenth(backend: Backend) -> None:
    window = backend.delay(hedge_delay_min_samples=20, hedge_delay_percentile=95.0)
    for value in random.Random(3).sample(range(1, 21), 20):
        window.record("r", float(value))
    assert window.delay_s("r") == 19.0


def test_window_is_trimmed_to_size(backend: Backend) -> None:
    window = backend.delay(
        hedge_delay_window=5, hedge_delay_min_samples=5, hedge_delay_percentile=99.0
    )
    for value in [100.0, 100.0, 100.0, 1.0, 2.0, 3.0, 4.0, 5.0]:
        window.record("r", value)
    assert window.samples("r") == [5.0, 4.0, 3.0, 2.0, 1.0]  # newest first
    assert window.delay_s("r") == 5.0  # the old 100 s outliers have left the window
    if backend.client is not None:
        assert backend.client.llen(keys.hedge_delay_window("r")) == 5
        assert backend.client.zcard(keys.hedge_delay_ranked("r")) == 5


@pytest.mark.parametrize("percentile", [50.0, 90.0, 95.0, 99.0])
def test_the_delay_follows_the_rolling_window_step_by_step(
    backend: Backend, percentile: float
) -> None:
    # Repeated latencies too: each entry leaves the window once, however many share it.
    rng = random.Random(int(percentile))
    window = backend.delay(
        hedge_delay_window=7, hedge_delay_min_samples=3, hedge_delay_percentile=percentile
    )
    seen: list[float] = []
    for _ in range(60):
        seen.append(rng.choice([0.5, 1.0, 1.0, 2.0, round(rng.uniform(0, 3), 3)]))
        window.record("r", seen[-1])
        last = seen[-7:]
        want = 1.0 if len(last) < 3 else expected_percentile(last, percentile)
        assert window.delay_s("r") == want
        assert window.samples("r") == last[::-1]


@pytest.mark.parametrize("bad", [-0.001, math.nan, math.inf, -math.inf, "0.5", None, True])
def test_invalid_latency_rejected(backend: Backend, bad: Any) -> None:
    window = backend.delay()
    with pytest.raises(InputError, match="latency_s") as err:
        window.record("r", bad)
    assert repr(bad) in str(err.value)
    assert window.samples("r") == []


def test_empty_role_rejected(backend: Backend) -> None:
    window: DelayWindow = backend.delay()
    with pytest.raises(InputError, match="role"):
        window.record("", 1.0)


@given(
    st.lists(st.floats(0.0, 1e6, allow_nan=False), min_size=1, max_size=60),
    st.floats(0.01, 100.0),
)
def test_nearest_rank_matches_definition(values: list[float], percentile: float) -> None:
    assert nearest_rank(values, percentile) == expected_percentile(values, percentile)


# ---------------------------------------------------------------- Redis specifics


def test_every_redis_key_has_a_ttl(client: redis.Redis) -> None:
    settings = HacoSettings()
    budget = RedisBudget(client, settings, clock=FakeClock())
    budget.earn()
    budget.try_spend(1, 10.0)
    budget.try_spend(10_000, 10.0)  # refused: still a write
    window = RedisDelayWindow(client, settings)
    for role in ("coder", "planner"):
        window.record(role, 0.25)
    # The budget's and the delay windows' key families only: a straggler of another test
    # (a group key written late) may share this database, and is not this test's business.
    found = sorted(
        k.decode()
        for pattern in (f"{keys.BUDGET}*", keys.hedge_delay_window("*"))
        for k in client.scan_iter(pattern)
    )
    assert found == sorted(
        [keys.BUDGET, *(keys.hedge_delay_window(r) for r in ("coder", "planner"))]
    )
    for key in found:
        assert client.ttl(key) > 0, key


def test_redis_errors_become_store_errors() -> None:
    dead = redis.Redis.from_url(UNREACHABLE_REDIS_URL, socket_connect_timeout=0.5)
    try:
        settings = HacoSettings()
        budget = RedisBudget(dead, settings, clock=FakeClock())
        window = RedisDelayWindow(dead, settings)
        with pytest.raises(StoreError, match=keys.BUDGET):
            budget.try_spend(1, 1.0)
        with pytest.raises(StoreError, match=keys.BUDGET):
            budget.earn()
        with pytest.raises(StoreError, match=keys.BUDGET):
            budget.snapshot()
        with pytest.raises(StoreError, match="haco:delay:r"):
            window.record("r", 1.0)
        with pytest.raises(StoreError, match=keys.hedge_delay_ranked("r")):
            window.delay_s("r")
        with pytest.raises(StoreError, match=keys.hedge_delay_window("r")):
            window.samples("r")
    finally:
        dead.close()


def test_corrupt_redis_data_becomes_store_error(client: redis.Redis) -> None:
    client.rpush(keys.hedge_delay_window("r"), "fast")
    client.set(keys.hedge_delay_ranked("r"), "1.0")  # a string where the sorted set goes
    client.hset(keys.BUDGET, "llm", "lots")
    settings = HacoSettings()
    window = RedisDelayWindow(client, settings)
    with pytest.raises(StoreError, match=keys.hedge_delay_window("r")):
        window.samples("r")
    with pytest.raises(StoreError, match=keys.hedge_delay_ranked("r")):
        window.delay_s("r")
    with pytest.raises(StoreError, match=keys.BUDGET):
        RedisBudget(client, settings, clock=FakeClock()).snapshot()


# ---------------------------------------------------------------- across processes


def _spend_in_process(url: str, now: float, attempts: int, start: Any, results: Any) -> None:
    """Runs in a spawned process: its own client and RedisBudget, the shared clock value."""
    client = redis.Redis.from_url(url)
    try:
        settings = HacoSettings(budget_burst=30, budget_ratio=0.0, budget_tokens_per_s=0.0)
        budget = RedisBudget(client, settings, clock=lambda: now)
        start.wait(timeout=60)
        results.put(sum(budget.try_spend(1, 2.0) for _ in range(attempts)))
    finally:
        client.close()


def test_budget_is_atomic_across_processes(client: redis.Redis, redis_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(2)
    results = ctx.Queue()
    args = (redis_url, T0, 50, start, results)
    procs = [ctx.Process(target=_spend_in_process, args=args) for _ in range(2)]
    try:
        for p in procs:
            p.start()
        wins = [results.get(timeout=90) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
            p.close()
        results.close()
        results.join_thread()
    assert sum(wins) == 30
    settings = HacoSettings(budget_burst=30, budget_ratio=0.0, budget_tokens_per_s=0.0)
    snap = RedisBudget(client, settings, clock=FakeClock()).snapshot()
    assert snap.spent_backups == 30
    assert snap.exhausted == 70
    assert snap.request_tokens == pytest.approx(0.0)
    assert snap.llm_tokens == pytest.approx(settings.budget_tokens_burst - 60.0)


def test_a_planning_read_credits_the_budget_as_earn_does(client: redis.Redis) -> None:
    """RedisStore.read_for_plan adds RedisBudget.plan_credit to the hash's ``pend``;
    every budget script folds it in first, and the snapshot counts it."""
    from coordinator.state.store import RedisStore

    clock = FakeClock(1000.0)
    settings = HacoSettings(budget_burst=2.0, budget_ratio=0.25)
    budget = RedisBudget(client, settings, clock=clock)
    store = RedisStore(client)
    assert budget.try_spend(2, 0.0)  # empty now
    for _ in range(3):
        assert store.read_for_plan(["c"], [], credit=budget.plan_credit()).credited
    assert budget.snapshot().request_tokens == 0.75
    assert not budget.try_spend(1, 0.0)
    store.read_for_plan(["c"], [], credit=budget.plan_credit())
    assert budget.try_spend(1, 0.0)  # 1.0 earned, folded in by the spend
    assert budget.snapshot().request_tokens == 0.0
    for _ in range(20):  # capped at the burst, as earn() is
        store.read_for_plan(["c"], [], credit=budget.plan_credit())
    assert budget.snapshot().request_tokens == 2.0
    assert budget.try_spend(2, 0.0) and not budget.try_spend(1, 0.0)
    assert client.pttl(keys.BUDGET) > 0
