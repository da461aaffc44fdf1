"""`haco bench calibration`: is the certificate honest?

For every scenario, both stopping rules (the dependence-aware ``haco`` and the paper's
``haco-indep``) and each τ: the predicted P_succ of every decision against what
happened, once warm (after ``warm_tasks``).

- *Observed success* is the event P_succ certifies: some member returned a qualified
  answer (the simulator draws ``solved = u < quality`` per successful member; quality is
  the probability of a qualified answer, as R⁻ = LCB(μ)·ρ reads it). Its complement, "no
  qualified success", is compared with 1 − τ.
- The calibration error (ECE, points): decisions binned by predicted P_succ (equal-width
  bins), Σ_b (n_b / N)·|mean predicted_b − observed_b|.
- The call-level all-failed rate (every member's call failed: the paper's metric), the
  hedge size and the tokens per task (members; the evaluator's in a second column) are
  the price of honesty.

Prints a table and JSON; writes calibration.json and reliability.png to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from rich.table import Table

from bench.console import show
from coordinator.core.params import PolicyParams
from coordinator.errors import InputError
from schemas.enums import StopReason
from sim.runner import simulate
from sim.scenario import load_builtin

SCENARIOS = ("overall", "zone_shock", "model_shock", "hardness")
# The dependence-aware rule, the paper's, and the dependence-aware one that sends the
# cheapest set near the achievable probability when τ is out of reach.
RULES = ("haco", "haco-indep", "haco-saturate")
_RULE_PARAMS: dict[str, tuple[str, dict[str, Any]]] = {
    "haco": ("haco", {}),
    "haco-indep": ("haco-indep", {}),
    "haco-saturate": ("haco", {"unreachable_members": "saturate"}),
}
TAUS = (0.9, 0.95)
BINS = 10


@dataclass(frozen=True)
class Job:
    scenario: str
    rule: str
    tau: float
    seed: int
    tasks: int
    warm_tasks: int


def _run(job: Job) -> dict[str, Any]:
    scenario = load_builtin(job.scenario)
    method, extra = _RULE_PARAMS[job.rule]
    params = PolicyParams(tau=job.tau, **extra)
    result, records = simulate(scenario, method, job.seed, params, tasks=job.tasks)
    warm = [r for r in records if r.task >= job.warm_tasks]
    warm_tasks = max(1, result.tasks - job.warm_tasks)
    return {
        "p": [r.p_success for r in warm],
        "ok": [bool(r.qualified) for r in warm],
        "all_failed": sum(r.all_failed for r in warm),
        "size": sum(len(r.members) for r in warm),
        "tokens": sum(r.tokens for r in warm),
        "judge_tokens": sum(r.judge_tokens for r in warm),
        "unreachable": sum(r.stop == StopReason.TARGET_UNREACHABLE.value for r in warm),
        "tasks": warm_tasks,
    }


def ece_points(
    p: np.ndarray, ok: np.ndarray, bins: int = BINS
) -> tuple[float, list[dict[str, Any]]]:
    """Expected calibration error in points, and the reliability diagram's bins."""
    idx = np.minimum((p * bins).astype(int), bins - 1)
    err = 0.0
    table = []
    for b in range(bins):
        sel = idx == b
        n = int(sel.sum())
        if not n:
            continue
        pred, obs = float(p[sel].mean()), float(ok[sel].mean())
        err += n / len(p) * abs(pred - obs)
        table.append({"bin": b, "n": n, "predicted": pred, "observed": obs})
    return 100.0 * err, table


def summarize(job_key: tuple[str, str, float], parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    scenario, rule, tau = job_key
    p = np.concatenate([np.asarray(x["p"], dtype=float) for x in parts])
    ok = np.concatenate([np.asarray(x["ok"], dtype=float) for x in parts])
    n = len(p)
    ece, bins = ece_points(p, ok)
    tasks = sum(x["tasks"] for x in parts)
    unqualified = 100.0 * (1.0 - float(ok.mean())) if n else 0.0
    return {
        "scenario": scenario, "rule": rule, "tau": tau, "decisions": n,
        "no_qualified_success_pct": unqualified,
        "target_pct": 100.0 * (1.0 - tau),
        "meets_target": unqualified <= 100.0 * (1.0 - tau),
        "mean_predicted": float(p.mean()) if n else 0.0,
        "observed_success": float(ok.mean()) if n else 0.0,
        "calibration_error_points": ece,
        "call_all_failed_pct": 100.0 * sum(x["all_failed"] for x in parts) / max(1, n),
        "mean_hedge_size": sum(x["size"] for x in parts) / max(1, n),
        "tokens_k_per_task": sum(x["tokens"] for x in parts) / tasks / 1000.0,
        "judge_tokens_k_per_task": sum(x["judge_tokens"] for x in parts) / tasks / 1000.0,
        "target_unreachable_pct": 100.0 * sum(x["unreachable"] for x in parts) / max(1, n),
        "bins": bins,
    }  # fmt: skip


def bench_calibration(
    scenarios: Sequence[str], taus: Sequence[float], seeds: Sequence[int], tasks: int,
    warm_tasks: int, workers: int = 0,
) -> dict[str, Any]:  # fmt: skip
    if warm_tasks >= tasks:
        raise InputError(f"warm_tasks={warm_tasks}; expected fewer than tasks={tasks}")
    jobs = [
        Job(sc, rule, tau, seed, tasks, warm_tasks)
        for sc in scenarios for rule in RULES for tau in taus for seed in seeds
    ]  # fmt: skip
    t0 = time.perf_counter()
    n = workers or min(len(jobs), os.cpu_count() or 1)
    if n <= 1:
        outs = [_run(j) for j in jobs]
    else:
        with ProcessPoolExecutor(max_workers=n) as pool:
            outs = list(pool.map(_run, jobs))
    groups: dict[tuple[str, str, float], list[dict[str, Any]]] = {}
    for job, out in zip(jobs, outs, strict=True):
        groups.setdefault((job.scenario, job.rule, job.tau), []).append(out)
    rows = [summarize(k, v) for k, v in groups.items()]
    return {
        "config": {
            "scenarios": list(scenarios), "taus": list(taus), "seeds": list(seeds),
            "tasks": tasks, "warm_tasks": warm_tasks, "bins": BINS, "runs": len(jobs),
        },
        "wall_time_s": time.perf_counter() - t0,
        "rows": rows,
    }  # fmt: skip


def plot_reliability(report: dict[str, Any], path: Path) -> None:
    scenarios = report["config"]["scenarios"]
    fig = Figure(figsize=(4.2 * len(scenarios), 4.2))
    for k, sc in enumerate(scenarios):
        ax = fig.add_subplot(1, len(scenarios), k + 1)
        ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--")
        for row in report["rows"]:
            if row["scenario"] != sc:
                continue
            xs = [b["predicted"] for b in row["bins"]]
            ys = [b["observed"] for b in row["bins"]]
            style = {"haco": "-o", "haco-indep": "--s"}.get(row["rule"], ":^")
            label = f"{row['rule']} τ={row['tau']} (ECE {row['calibration_error_points']:.1f})"
            ax.plot(xs, ys, style, ms=3, label=label)
        ax.set_title(sc)
        ax.set_xlabel("predicted P_succ")
        ax.set_ylabel("observed qualified success")
        ax.set_xlim(0.5, 1.0)
        ax.set_ylim(0.5, 1.0)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_table(report: dict[str, Any]) -> None:
    t = Table(title="haco bench calibration — once warm, all seeds pooled")
    cols = ("scenario", "rule", "τ", "no qualified success %", "1−τ %", "ECE pts",
            "pred / obs", "call all-failed %", "hedge size", "tokens k/task",
            "evaluator k/task", "unreachable %")  # fmt: skip
    for c in cols:
        t.add_column(c, justify="left" if c in ("scenario", "rule") else "right")
    for r in report["rows"]:
        t.add_row(
            r["scenario"], r["rule"], f"{r['tau']:.2f}",
            f"{r['no_qualified_success_pct']:.2f}" + ("" if r["meets_target"] else " ✘"),
            f"{r['target_pct']:.1f}", f"{r['calibration_error_points']:.2f}",
            f"{r['mean_predicted']:.3f} / {r['observed_success']:.3f}",
            f"{r['call_all_failed_pct']:.3f}", f"{r['mean_hedge_size']:.2f}",
            f"{r['tokens_k_per_task']:.1f}", f"{r['judge_tokens_k_per_task']:.1f}",
            f"{r['target_unreachable_pct']:.1f}",
        )  # fmt: skip
    show(t)


def write(report: dict[str, Any], out: Path) -> list[Path]:
    """calibration.json (with the bins) and reliability.png in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    js, png = out / "calibration.json", out / "reliability.png"
    js.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    plot_reliability(report, png)
    return [js, png]


def slim(report: dict[str, Any]) -> dict[str, Any]:
    """The report without the per-bin tables (what stdout shows)."""
    return {**report, "rows": [{k: v for k, v in r.items() if k != "bins"} for r in report["rows"]]}


def parse_taus(text: str) -> list[float]:
    try:
        taus = [float(t) for t in text.split(",") if t.strip()]
    except ValueError as exc:
        raise InputError(f"taus {text!r}: expected numbers like 0.9,0.95") from exc
    if not taus:
        raise InputError("no tau given; expected numbers like 0.9,0.95")
    for tau in taus:
        if not 0.0 < tau < 1.0:
            raise InputError(f"tau={tau}; expected a number strictly between 0 and 1")
    return taus


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.calibration", description=__doc__)
    ap.add_argument("--scenario", action="append", choices=SCENARIOS)
    ap.add_argument("--taus", default=",".join(str(t) for t in TAUS))
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--warm-tasks", type=int, default=50)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("out/bench/calibration"))
    args = ap.parse_args(argv)
    if args.seeds < 1 or args.tasks < 1:
        raise SystemExit("error: --seeds and --tasks must be at least 1")
    try:
        report = bench_calibration(
            args.scenario or SCENARIOS, parse_taus(args.taus), list(range(args.seeds)),
            args.tasks, args.warm_tasks, args.workers,
        )  # fmt: skip
    except InputError as exc:
        raise SystemExit(f"error: {exc}") from exc
    write(report, args.out)
    print_table(report)
    print(json.dumps(slim(report), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
