"""bench.launchlag: a backup's stages add up to its lag, and its marks come from a real
wake token's push and pop and a real budget spend."""

from __future__ import annotations

import redis

from bench import launchlag
from bench.rtlib import Marks
from coordinator.config import HacoSettings
from coordinator.runtime.coordinator import WAKE


def test_the_stages_add_up_to_the_lag_in_order() -> None:
    parts = launchlag.stages(10.0, 10.2, 10.7, (10.75, 11.1), 11.2)
    assert list(parts) == list(launchlag.STAGES)
    assert abs(sum(parts.values()) - 1.2) < 1e-9
    assert all(v > 0 for v in parts.values())


def test_marks_come_from_the_token_and_the_spend(redis_db: redis.Redis) -> None:
    lag = launchlag.LagMarks()
    store = launchlag.LagStore(redis_db, Marks(), lag)
    store.push_reply("g1", "a report", 60.0)
    assert lag.pushed == {}  # a report is not a wake token
    store.push_reply("g1", WAKE, 60.0)
    assert set(lag.pushed) == {"g1"}
    got = store.pop_replies("g1", 0.1, 16)
    assert got == ["a report", WAKE]
    assert lag.woke["g1"] >= lag.pushed["g1"]
    budget = launchlag.LagBudget(redis_db, HacoSettings(), lag)
    budget.try_spend(1, 10.0)
    assert lag.spend is not None and lag.spend[0] <= lag.spend[1]
