"""The offline model of the staggered policy (bench/tailpolicy.py) runs the production
window and budget: its backups stay within the budget, and a wider window is read."""

from __future__ import annotations

from bench.tailpolicy import one_run
from coordinator.config import HacoSettings


def test_backups_stay_within_the_budget_and_the_tail_shrinks() -> None:
    calls = 2000
    hedged = HacoSettings(hedge_delay_window=200, budget_ratio=0.05, budget_burst=10.0)
    p99_s, load = one_run(hedged, calls, seed=1)
    assert 0.0 < load <= 0.05 + 10.0 / calls  # the ratio plus the burst, at most
    unhedged = HacoSettings(hedge_delay_window=200, budget_ratio=0.0, budget_burst=0.0)
    p99_alone, no_load = one_run(unhedged, calls, seed=1)
    assert no_load == 0.0
    assert p99_s < p99_alone  # the same draws: hedging cut the tail
