"""The offline model of the staggered policy (bench/tailpolicy.py) runs the production
window and budget: its backups stay within the budget, and a wider window is read."""

from __future__ import annotations

import math

from bench.rttail import MEDIAN_S, SIGMA
from bench.tailpolicy import FIXED, model, one_run
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


def test_a_fixed_delay_replaces_the_window() -> None:
    calls, s = 2000, HacoSettings(hedge_delay_window=200, budget_ratio=0.05, budget_burst=10.0)
    # A delay no draw outlasts: no backup, the tail of the draws alone.
    never, no_load = one_run(s, calls, seed=1, fixed_delay_s=1e9)
    unhedged = HacoSettings(hedge_delay_window=200, budget_ratio=0.0, budget_burst=0.0)
    alone, _ = one_run(unhedged, calls, seed=1)
    assert no_load == 0.0 and never == alone
    # A delay every draw outlasts: backups as long as the budget pays for them.
    _, load = one_run(s, calls, seed=1, fixed_delay_s=0.0)
    assert 0.04 <= load <= 0.05 + 10.0 / calls
    # At the draws' true p95 the backups go to the slow calls: the tail cut.
    cut, _ = one_run(s, calls, seed=1, fixed_delay_s=MEDIAN_S * math.exp(SIGMA * 1.645))
    assert cut < alone


def test_the_model_sets_the_ideal_delay_beside_the_windows() -> None:
    res = model(calls=500, seeds=2, windows=[200])
    assert list(res["by_window"]) == ["200", FIXED]
    assert res["by_window"]["200"]["delay"] == "rolling window"
    assert res["by_window"][FIXED]["delay"].startswith("fixed at ")
    for row in res["by_window"].values():
        assert row["p99_over_ideal_median"] > 0.5
        lo, hi = row["p99_over_paired_ideal_p5_p95"]
        assert lo <= row["p99_over_paired_ideal_median"] <= hi
        assert 0.0 <= row["paired_share_within_1_05"] <= 1.0
