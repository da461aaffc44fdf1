"""`haco bench frontier`: what HACO's hedge sets cost against MoA, per launch mode.

On the paper's pool (the built-in ``overall`` scenario) at τ = 0.9, HACO runs with the
simulator's launch modes (sim.engine.SimOptions): ``parallel`` as published (every
member at t = 0, losers kept for harvesting), ``parallel`` with the losers cancelled,
and ``staggered`` with the hedge delay at the p50/p75/p90/p95 of the launched
candidate's end-to-end latency, with and without cancellation; MoA (the whole pool,
the evaluator's best) is the reference. Each row is the mean over seeds of:

- tokens k/task: the members' input + output tokens (a cancelled member's up to its cut),
- evaluator tokens k/task: the judge's, a column of its own (never folded in, never hidden),
- tokens / MoA tokens (members' tokens only, both sides),
- all-failed % of role invocations (and the pooled count), latency s/task,
- mean members launched and mean hedge size decided, and the qualified-answer rates.

The goal: at most ``GOAL_TOKEN_RATIO`` of MoA's tokens with all-failed at most
``GOAL_ALL_FAILED_PCT`` %. The *chosen default* is the cheapest HACO configuration
meeting it (ties: the lower all-failed rate). Runs are independent and deterministic per
(configuration, seed), so they fan out over a process pool as `haco bench paper` does.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from rich.table import Table

from bench.console import show
from bench.paper import execute as paper_execute
from coordinator.core.params import PolicyParams
from coordinator.errors import InputError
from schemas.enums import LaunchMode
from schemas.scenario import Scenario
from sim.engine import SimOptions
from sim.runner import RunResult, check_workflow_roles, run
from sim.scenario import load_builtin

GOAL_TOKEN_RATIO = 0.35
GOAL_ALL_FAILED_PCT = 0.4
PERCENTILES = (50.0, 75.0, 90.0, 95.0)
REFERENCE = "moa"
PAPER = "parallel (paper)"


@dataclass(frozen=True)
class Config:
    label: str
    method: str
    options: SimOptions


def configs(percentiles: Sequence[float] = PERCENTILES) -> list[Config]:
    out = [
        Config(PAPER, "haco", SimOptions()),
        Config("parallel+cancel", "haco", SimOptions(cancel_losers=True)),
    ]
    for p in percentiles:
        for cancel in (False, True):
            opts = SimOptions(LaunchMode.STAGGERED, p, cancel_losers=cancel)
            out.append(Config(f"staggered p{p:g}" + ("+cancel" if cancel else ""), "haco", opts))
    out.append(Config(REFERENCE, REFERENCE, SimOptions()))
    return out


@dataclass(frozen=True)
class Job:
    scenario: Scenario
    config: Config
    seed: int
    tau: float
    tasks: int


def _run_job(job: Job) -> RunResult:
    params = PolicyParams(tau=job.tau)
    c = job.config
    return run(job.scenario, c.method, job.seed, params, job.tasks, options=c.options)


def execute(
    jobs: list[Job], workers: int, progress: Callable[[Job], None] | None = None
) -> list[RunResult]:
    return paper_execute(jobs, workers, progress, _run_job)


_MEANS = (
    "tokens_k_per_task",
    "judge_tokens_k_per_task",
    "all_failed_pct",
    "latency_s_per_task",
    "mean_launched",
    "mean_hedge_size",
    "mean_cancelled",
    "qualified_pct",
    "winner_qualified_pct",
    "avg_score",
)


def _row(config: Config, rs: list[RunResult]) -> dict[str, Any]:
    row: dict[str, Any] = {
        "config": config.label,
        "method": config.method,
        "launch": config.options.launch.value,
        "stagger_percentile": (
            config.options.stagger_percentile
            if config.options.launch is LaunchMode.STAGGERED
            else None
        ),
        "cancel_losers": config.options.cancel_losers,
        "seeds": [r.seed for r in rs],
    }
    for key in _MEANS:
        vals = [float(getattr(r, key)) for r in rs]
        row[key] = float(np.mean(vals))
        row[f"{key}_per_seed"] = vals
    failed = sum(round(r.all_failed_pct * r.invocations / 100.0) for r in rs)
    invocations = sum(r.invocations for r in rs)
    row["all_failed"] = failed
    row["invocations"] = invocations
    row["all_failed_pct_pooled"] = 100.0 * failed / invocations if invocations else 0.0
    return row


def frontier(
    scenario: Scenario,
    seeds: Sequence[int],
    tau: float = 0.9,
    tasks: int = 200,
    workers: int = 0,
    percentiles: Sequence[float] = PERCENTILES,
    progress: Callable[[Job], None] | None = None,
) -> dict[str, Any]:
    if not 0.0 < tau < 1.0:
        raise InputError(f"tau={tau}; expected a number strictly between 0 and 1")
    if tasks < 1 or not seeds:
        raise InputError(f"tasks={tasks}, seeds={list(seeds)}; expected at least one of each")
    check_workflow_roles(scenario)
    cfgs = configs(percentiles)
    jobs = [Job(scenario, c, s, tau, tasks) for c in cfgs for s in seeds]
    t0 = time.perf_counter()
    results = execute(jobs, workers, progress)
    wall_s = time.perf_counter() - t0
    rows = []
    for c in cfgs:
        rows.append(_row(c, [r for r, j in zip(results, jobs, strict=True) if j.config is c]))
    ref = next(r for r in rows if r["config"] == REFERENCE)
    for r in rows:
        moa = ref["tokens_k_per_task"]
        r["tokens_over_moa"] = r["tokens_k_per_task"] / moa if moa > 0 else None
        r["meets_goal"] = (
            r["method"] != REFERENCE
            and r["tokens_over_moa"] is not None
            and r["tokens_over_moa"] <= GOAL_TOKEN_RATIO
            and r["all_failed_pct"] <= GOAL_ALL_FAILED_PCT
        )
    meeting = [r for r in rows if r["meets_goal"]]
    chosen = min(meeting, key=lambda r: (r["tokens_k_per_task"], r["all_failed_pct"]), default=None)
    for r in rows:
        r["chosen_default"] = chosen is not None and r is chosen
    return {
        "config": {
            "scenario": scenario.name,
            "tau": tau,
            "seeds": list(seeds),
            "tasks": tasks,
            "percentiles": list(percentiles),
            "runs": len(jobs),
        },
        "goal": {
            "tokens_over_moa_max": GOAL_TOKEN_RATIO,
            "all_failed_pct_max": GOAL_ALL_FAILED_PCT,
            "rule": "cheapest HACO configuration meeting both bounds (ties: lower all-failed)",
        },
        "chosen_default": None if chosen is None else chosen["config"],
        "wall_time_s": wall_s,
        "rows": rows,
    }


def table(report: dict[str, Any]) -> Table:
    cfg = report["config"]
    t = Table(
        title=(
            f"cost frontier — {cfg['scenario']}, τ={cfg['tau']}, {cfg['tasks']} tasks, "
            f"mean over seeds {cfg['seeds']} (per task: tokens, evaluator tokens, latency; "
            "per invocation: all-failed, launched, hedge size decided, qualified)"
        )
    )
    cols = (
        "configuration",
        "tokens k",
        "eval. k",
        "÷ MoA",
        "all-failed %",
        "failed",
        "latency s",
        "launched",
        "hedge",
        "qual. %",
        "win qual. %",
        "goal",
    )
    for c in cols:
        t.add_column(c, justify="left" if c == "configuration" else "right", no_wrap=True)
    for r in report["rows"]:
        mark = "chosen" if r["chosen_default"] else ("meets" if r["meets_goal"] else "")
        ratio = r["tokens_over_moa"]
        t.add_row(
            r["config"],
            f"{r['tokens_k_per_task']:.1f}",
            f"{r['judge_tokens_k_per_task']:.1f}",
            "—" if ratio is None else f"{100 * ratio:.1f}%",
            f"{r['all_failed_pct']:.3f}",
            f"{r['all_failed']}/{r['invocations']}",
            f"{r['latency_s_per_task']:.1f}",
            f"{r['mean_launched']:.2f}",
            f"{r['mean_hedge_size']:.2f}",
            f"{r['qualified_pct']:.1f}",
            f"{r['winner_qualified_pct']:.1f}",
            mark,
        )
    return t


def plot(report: dict[str, Any], path: Path) -> None:
    """Tokens per task against the all-failed rate, the goal region shaded."""
    rows = report["rows"]
    ref = next(r for r in rows if r["config"] == REFERENCE)
    fig = Figure(figsize=(10, 5))
    ax = fig.add_subplot()
    x_goal = GOAL_TOKEN_RATIO * ref["tokens_k_per_task"]
    ax.fill_between([0.0, x_goal], -1.0, GOAL_ALL_FAILED_PCT, color="tab:green", alpha=0.08,
                    label="goal: ≤ 35% of MoA, all-failed ≤ 0.4%")  # fmt: skip
    ax.axvline(x_goal, color="tab:green", linestyle="--", linewidth=1)
    ax.axhline(GOAL_ALL_FAILED_PCT, color="tab:red", linestyle="--", linewidth=1)
    colors = [f"C{i % 10}" for i in range(len(rows))]
    for r, color in zip(rows, colors, strict=True):
        marker = "*" if r["chosen_default"] else ("s" if r["method"] == REFERENCE else "o")
        if r["launch"] == LaunchMode.STAGGERED and marker == "o":
            marker = "^" if r["cancel_losers"] else "v"
        label = r["config"] + (" (chosen default)" if r["chosen_default"] else "")
        ax.scatter(r["tokens_k_per_task"], r["all_failed_pct"], s=160 if marker == "*" else 45,
                   marker=marker, color=color, zorder=3, label=label)  # fmt: skip
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=-0.02, top=max(0.5, 1.2 * max(r["all_failed_pct"] for r in rows)))
    ax.set_xlabel("members' tokens per task (k); evaluator tokens not included")
    ax.set_ylabel("all-failed invocations (%)")
    cfg = report["config"]
    ax.set_title(f"Cost frontier, {cfg['scenario']}, τ={cfg['tau']} (★ chosen default)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write(report: dict[str, Any], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    data = out_dir / "frontier.json"
    data.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    png = out_dir / "frontier.png"
    plot(report, png)
    return [data, png]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.frontier", description=__doc__)
    ap.add_argument("--scenario", default="overall", help="built-in scenario")
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument("--seeds", type=int, default=5, help="how many seeds")
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--tau", type=float, default=0.9)
    ap.add_argument("--workers", type=int, default=0, help="processes (0 = one per core)")
    ap.add_argument("--out", type=Path, default=None, help="write frontier.json and .png here")
    args = ap.parse_args(argv)
    report = frontier(
        load_builtin(args.scenario),
        list(range(args.seed, args.seed + args.seeds)),
        args.tau,
        args.tasks,
        args.workers,
    )
    show(table(report))
    if args.out is not None:
        for p in write(report, args.out):
            show(f"wrote {p}")
    print(json.dumps(report, indent=2, allow_nan=False))


if __name__ == "__main__":
    main()
