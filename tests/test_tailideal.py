"""bench/tailideal.py: the ideal staggered launch on given draws, and a run's calls paired
with the ideal launch on their own draws."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from bench.rttail import over_delay_alone, paired_ideal
from bench.tailideal import delay_for_load, pair, ratio_interval, staggered
from bench.tailpolicy import Run


def test_the_ideal_takes_the_backup_at_its_delay_where_rank_0_outlasts_it() -> None:
    x0 = np.array([0.001, 0.002, 0.003, 0.010, 0.020])
    x1 = np.array([math.nan, math.nan, 0.5, 0.001, 0.5])  # read only where it fires
    lat, fired = staggered(x0, x1, 0.003)
    assert fired.tolist() == [False, False, False, True, True]
    # the fourth: backup at 3 ms + 1 ms beats 10 ms; the fifth: rank 0's 20 ms wins
    assert lat == pytest.approx([0.001, 0.002, 0.003, 0.004, 0.020])


def test_the_delay_fires_on_the_extra_load_share_of_the_calls() -> None:
    x0 = np.array([5.0, 1.0, 4.0, 2.0, 3.0, 9.0, 7.0, 6.0, 8.0, 10.0])
    for load, fires in ((0.1, 1), (0.2, 2), (0.25, 2), (0.5, 5), (0.9, 9)):
        assert int((x0 > delay_for_load(x0, load)).sum()) == fires, load
    assert delay_for_load(x0, 0.0) == math.inf  # no backup
    assert int((x0 > delay_for_load(x0, 1.0)).sum()) == 10  # every call: one at once
    assert delay_for_load(np.array([]), 0.5) == math.inf


def _m(rank: int, proc_s: float | None, status: str = "succeeded") -> dict[str, Any]:
    return {"rank": rank, "status": status, "proc_latency_s": proc_s}


def test_a_run_is_paired_with_the_ideal_on_its_own_draws() -> None:
    traces = {
        "a": [_m(0, 0.001)],
        "b": [_m(0, 0.002)],
        "c": [_m(0, 0.050), _m(1, 0.004)],  # the run launched a backup: its draw is read
        "d": [_m(0, 0.040)],  # the ideal fires here but the run did not: a fresh draw
        "e": [_m(0, None, "failed")],  # no draw of rank 0: left out
    }
    calls = [(g, 0.03) for g in "abcde"]
    lat = [0.0015, 0.0025, 0.0345, 0.0405, 0.1]
    asked: list[int] = []

    def fresh(n: int) -> np.ndarray:
        asked.append(n)
        return np.full(n, 0.1)

    got = pair(calls, lat, traces, extra_load=0.5, fresh=fresh)
    assert got is not None
    assert got.keep.tolist() == [True, True, True, True, False]  # e: no rank-0 draw
    # 2 of the 4 paired calls fire: the delay is the draw below the two longest, 2 ms
    assert got.delay_s == pytest.approx(0.002)
    assert got.filled == 1 and asked == [1]
    assert got.ideal_s == pytest.approx([0.001, 0.002, 0.006, 0.040])
    assert got.lat_s == pytest.approx(lat[:4])
    assert pair(calls[4:], lat[4:], traces, 0.5, fresh) is None


def test_the_ratio_of_a_run_to_itself_is_one_and_a_scaled_run_its_scale() -> None:
    x = np.random.default_rng(3).lognormal(0.0, 1.0, 2000)
    assert ratio_interval(x, x) == pytest.approx([1.0, 1.0])
    lo, hi = ratio_interval(1.1 * x, x)
    assert lo == pytest.approx(1.1) and hi == pytest.approx(1.1)
    lo, hi = ratio_interval(x, np.random.default_rng(4).lognormal(0.0, 1.0, 2000))
    assert lo < hi  # unpaired draws: the interval opens


def test_the_ideal_run_is_at_one_of_its_own_paired_ideal() -> None:
    rng = np.random.default_rng(5)
    draws = rng.lognormal(-5.0, 1.5, (3000, 2))
    load = 0.05
    lat, fired = staggered(draws[:, 0], draws[:, 1], delay_for_load(draws[:, 0], load))
    assert fired.mean() == pytest.approx(load)
    assert Run(lat, draws, load).over_paired_ideal() == pytest.approx(1.0)
    assert Run(lat * 1.2, draws, load).over_paired_ideal() == pytest.approx(1.2)


def test_the_tail_bench_summarises_the_paired_ideal_beside_the_goal() -> None:
    traces = {f"g{i}": [_m(0, 0.001 * (i + 1))] for i in range(100)}
    traces["g99"].append(_m(1, 0.001))  # the slowest call's backup ran: 1 ms after 99 ms
    calls = [(f"g{i}", 0.099) for i in range(100)]
    lat = [0.001 * (i + 1) + 0.0005 for i in range(100)]
    lat[99] = 0.1005  # the runtime launched it late: the backup did not help
    same = [0.001 * (i + 1) for i in range(100)]
    none_unpaid = np.zeros(100, dtype=bool)
    got = paired_ideal(calls, lat, same, traces, 0.01, none_unpaid)
    assert got is not None
    assert got["filled"] == 0 and got["unpaired"] == 0
    assert got["delay_ms"] == pytest.approx(99.0)  # fires on the one slowest call
    ideal = np.array(same)
    ideal[99] = 0.1  # 99 ms + 1 ms: no better than rank 0's 100 ms
    assert got["p99_ms"] == pytest.approx(float(np.percentile(ideal, 99)) * 1e3)
    assert got["p99_over"] > 1.0 and got["same_draws_over"] == pytest.approx(1.0)
    lo, hi = got["p99_over_ci90"]
    assert lo <= got["p99_over"] <= hi
    # on the draws, with the run's own 99 ms delay: as the ideal's but for g99's backup
    assert got["draws_over"] == pytest.approx(1.0)
    assert got["draws_paid_over"] == got["draws_over"]  # no refusal to pay
    assert paired_ideal(calls, lat, same, {}, 0.01, none_unpaid) is None


def _timed(rank: int, own_s: float) -> dict[str, Any]:
    started = 10.0
    return {
        "rank": rank,
        "status": "succeeded",
        "started_at_s": started,
        "finished_at_s": started + own_s,
    }


def test_a_call_whose_rank_0_outlasts_its_delay_alone_had_its_backup_refused() -> None:
    traces = {
        "fast": [_timed(0, 0.010)],  # within its delay
        "refused": [_timed(0, 0.300)],  # past it, alone
        "hedged": [_timed(0, 0.300), _timed(1, 0.005)],  # past it, a backup ran
    }
    calls = [("fast", 0.070), ("refused", 0.070), ("hedged", 0.070), ("lost", 0.070)]
    got = over_delay_alone(calls, [1, 1, 2, 1], traces)
    assert got.tolist() == [False, True, False, False]  # "lost": no trace, not counted


def test_paid_refusals_are_held_to_the_ideal_at_the_load_they_make() -> None:
    n = 200
    draws = [0.001 * (i + 1) for i in range(n - 3)] + [5.0, 5.0, 5.0]
    traces = {f"g{i}": [_m(0, d)] for i, d in enumerate(draws)}
    calls = [(f"g{i}", 0.150) for i in range(n)]
    unpaid = np.zeros(n, dtype=bool)
    unpaid[-3:] = True  # the three ran far past the delay, their backups refused
    got = paired_ideal(calls, draws, draws, traces, 0.0, unpaid)
    assert got is not None
    # no backup ran: against the ideal at no extra load, the run is its own ideal
    assert got["draws_over"] == pytest.approx(1.0)
    assert got["paid_extra_load"] == pytest.approx(3 / n)
    # paid, the three end by their 150 ms delay plus a fresh draw, not at 5 s; the ideal
    # at 1.5% fires on the same three (at 197 ms) on the same draws: the tails are close
    assert got["draws_paid_over"] == pytest.approx(1.0, abs=0.1)
