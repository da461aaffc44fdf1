"""The staggered tail's policy alone, offline: the rolling hedge delay and the hedge budget
on the tail bench's backend (bench/rttail.py: 5 ms median, 200 ms p99), with no runtime
cost, against the ideal launch at the true p95 at the same extra load.

    python -m bench.tailpolicy [--calls 6000] [--seeds 60] [--windows 500,1000,2000]

Each seed draws every call's two backend latencies; per call the production policy
decides: the delay from :class:`MemoryDelayWindow` (the nearest-rank
``hedge_delay_percentile`` of the last ``hedge_delay_window`` completions), a backup when
rank 0 outlasts it and :class:`MemoryBudget` pays (each call earns ``budget_ratio``). The
call takes the faster of rank 0 and the backup launched at the delay; both complete and
feed the window (losers are kept, as in the bench). The ratio to the ideal spreads over
the seeds: this is what the policy costs before any runtime overhead, and how much a
6000-call run of it can vary.

Beside the windows, one row launches at the ideal's own delay (the true p95, fixed) with
the same budget on the same draws: what is left of its ratio is the sampling of a p99
over this many calls and the budget's refusals, not the delay's estimate. The distance
from that row to a window's is what a better estimate of the delay could still win.

The last columns take each run against the ideal launch on its own draws at its own
extra load (paired, :mod:`bench.tailideal`): the sampling of the draws cancels, and
what is left is the policy's own cost.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from bench.hotpath_goals import ideal_at
from bench.rttail import WARMUP, backend_draws, oracle
from bench.tailideal import delay_for_load, p99, staggered
from coordinator.config import HacoSettings
from coordinator.core.percentiles import interpolated
from coordinator.state.budget import MemoryBudget
from coordinator.state.hedgedelay import MemoryDelayWindow

err = Console(stderr=True)


def one_run(
    settings: HacoSettings, calls: int, seed: int, fixed_delay_s: float | None = None
) -> tuple[float, float]:
    """(p99 s, extra load) of ``calls`` staggered calls after the bench's warm-up;
    ``fixed_delay_s``: every backup due then, in place of the window's delay."""
    run = simulate(settings, calls, seed, fixed_delay_s)
    return interpolated(run.lat_s.tolist(), 99)[0], run.extra_load


@dataclass(frozen=True)
class Run:
    """One offline run of the policy: its calls' latencies, their draws, its extra load."""

    lat_s: np.ndarray  # each measured call's latency
    draws_s: np.ndarray  # its two draws (rank 0, the backup's), calls × 2
    extra_load: float

    def over_paired_ideal(self) -> float:
        """p99 over the ideal launch on these very draws at this extra load."""
        x0, x1 = self.draws_s[:, 0], self.draws_s[:, 1]
        ideal, _ = staggered(x0, x1, delay_for_load(x0, self.extra_load))
        return p99(self.lat_s) / p99(ideal)


def simulate(
    settings: HacoSettings, calls: int, seed: int, fixed_delay_s: float | None = None
) -> Run:
    draws = backend_draws(np.random.default_rng(seed), 2 * (WARMUP + calls)).reshape(-1, 2)
    window, budget = MemoryDelayWindow(settings), MemoryBudget(settings)
    lat, backups = [], 0
    for i, (x0, x1) in enumerate(draws.tolist()):
        if i < WARMUP:  # unhedged calls fill the window, as the bench's warm-up does
            window.record("r", x0)
            continue
        delay = window.delay_s("r") if fixed_delay_s is None else fixed_delay_s
        budget.earn()
        t = x0
        if x0 > delay and budget.try_spend(1, 0.0):
            backups += 1
            t = min(x0, delay + x1)
            window.record("r", x1)
        window.record("r", x0)
        lat.append(t)
    return Run(np.asarray(lat), draws[WARMUP:], backups / calls)


# The row of the ideal's own delay, keyed beside the window sizes.
FIXED = "true p95, fixed"


def model(calls: int, seeds: int, windows: list[int]) -> dict[str, Any]:
    offline = oracle()
    curve, true_delay_s = offline["curve"], offline["ideal_staggered_p95"]["delay_ms"] / 1e3
    out: dict[str, Any] = {"calls": calls, "seeds": seeds, "by_window": {}}
    # (row, its settings, its fixed delay: None, the window's)
    rows: list[tuple[str, HacoSettings, float | None]] = [
        (str(w), HacoSettings(hedge_delay_window=w), None) for w in windows
    ]
    for name, s, fixed in [*rows, (FIXED, HacoSettings(), true_delay_s)]:
        ratios, paired, loads = [], [], []
        for seed in range(seeds):
            run = simulate(s, calls, seed, fixed)
            ideal = ideal_at(curve, run.extra_load)
            p99_ms = interpolated(run.lat_s.tolist(), 99)[0] * 1e3
            ratios.append(p99_ms / ideal if ideal else float("nan"))
            paired.append(run.over_paired_ideal())
            loads.append(run.extra_load)
        lo, med, hi = np.percentile(ratios, [5, 50, 95])
        plo, pmed, phi = np.percentile(paired, [5, 50, 95])
        out["by_window"][name] = {
            "p99_over_ideal_median": float(med),
            "p99_over_ideal_p5_p95": [float(lo), float(hi)],
            "share_within_1_05": float(np.mean(np.asarray(ratios) <= 1.05)),
            # The same runs against the ideal on their own draws (bench.tailideal).
            "p99_over_paired_ideal_median": float(pmed),
            "p99_over_paired_ideal_p5_p95": [float(plo), float(phi)],
            "paired_share_within_1_05": float(np.mean(np.asarray(paired) <= 1.05)),
            "extra_load_mean": float(np.mean(loads)),
            "delay": "rolling window" if fixed is None else f"fixed at {fixed * 1e3:.1f} ms",
            "settings": {
                "hedge_delay_percentile": s.hedge_delay_percentile,
                "budget_ratio": s.budget_ratio,
                "budget_burst": s.budget_burst,
            },
        }
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=6000, help="measured calls per run")
    p.add_argument("--seeds", type=int, default=60, help="runs per window size")
    p.add_argument("--windows", default="500,1000,2000", help="hedge_delay_window sizes")
    args = p.parse_args(argv)
    try:
        windows = [int(x) for x in args.windows.split(",") if x.strip()]
    except ValueError:
        p.error(f"--windows must be comma-separated integers, got {args.windows!r}")
    if args.calls < 100 or args.seeds < 1 or not windows or min(windows) < 1:
        p.error(f"need --calls ≥ 100, --seeds ≥ 1, windows ≥ 1; got {args.calls}, "
                f"{args.seeds}, {args.windows!r}")  # fmt: skip
    res = model(args.calls, args.seeds, windows)
    res["command"] = " ".join(["python -m bench.tailpolicy", *argv])
    t = Table(
        title=f"the staggered policy alone (p95 delay, 5% budget), {args.calls} calls × "
        f"{args.seeds} seeds: p99 over the ideal launch at the same extra load"
    )
    for c in ("window", "median", "5th–95th percentile", "runs ≤ 1.05", "extra load",
              "paired: median", "5th–95th", "runs ≤ 1.05"):  # fmt: skip
        t.add_column(c, justify="right")
    for w, r in res["by_window"].items():
        lo, hi = r["p99_over_ideal_p5_p95"]
        plo, phi = r["p99_over_paired_ideal_p5_p95"]
        t.add_row(w, f"{r['p99_over_ideal_median']:.3f}", f"{lo:.3f}–{hi:.3f}",
                  f"{r['share_within_1_05']:.0%}", f"{r['extra_load_mean']:.2%}",
                  f"{r['p99_over_paired_ideal_median']:.3f}", f"{plo:.3f}–{phi:.3f}",
                  f"{r['paired_share_within_1_05']:.0%}")  # fmt: skip
    err.print(t)
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
