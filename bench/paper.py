"""`haco bench paper`: methods × scenarios × seeds in the simulator, plus the τ sweep.

Runs are independent, so they fan out over a process pool; each run is deterministic
for its (scenario, method, seed, τ), so the result does not depend on the pool size.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from bench.report import SWEEP_METHOD, derive
from coordinator.core.params import PolicyParams, ProfileSettings
from coordinator.errors import InputError
from schemas.scenario import Scenario
from sim.runner import RunResult, check_workflow_roles, method_names, run

DEFAULT_TAUS = (0.70, 0.80, 0.90, 0.95)
J = TypeVar("J")
R = TypeVar("R")


@dataclass(frozen=True)
class Job:
    scenario: Scenario
    method: str
    seed: int
    tau: float
    tasks: int | None
    half_life: float
    sweep: bool = False  # part of the τ sweep, aggregated apart from the main table


def _run_job(job: Job) -> RunResult:
    params = PolicyParams(tau=job.tau)
    prof = ProfileSettings(half_life=job.half_life)
    return run(job.scenario, job.method, job.seed, params, job.tasks, prof)


@dataclass
class BenchConfig:
    scenarios: list[Scenario]
    methods: list[str] | None = None  # None = every method the scenario defines
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    tau: float = 0.9
    taus: Sequence[float] = DEFAULT_TAUS
    # The sweep's failure rates at τ >= 0.9 are a handful of events per 1000 steps, so
    # it takes more seeds than the main table to rank its points reliably.
    sweep_seeds: list[int] = field(default_factory=lambda: list(range(10)))
    tasks: int | None = None
    half_life: float = float("inf")
    workers: int = 0  # 0 = one per core

    def validate(self) -> None:
        if not self.scenarios:
            raise InputError("no scenario given; expected --scenario NAME or --scenario-file PATH")
        for t in (self.tau, *self.taus):
            if not 0.0 < t < 1.0:
                raise InputError(f"tau={t}; expected a number strictly between 0 and 1")
        if self.tasks is not None and self.tasks < 1:
            raise InputError(f"tasks={self.tasks}; expected at least 1")
        if not self.seeds or (self.taus and not self.sweep_seeds):
            raise InputError("no seeds; expected at least one")
        names = {s.name for s in self.scenarios}
        if len(names) != len(self.scenarios):
            raise InputError(f"scenario names repeat: {[s.name for s in self.scenarios]}")
        for s in self.scenarios:
            check_workflow_roles(s)
            known = method_names(s)
            for m in self.methods or []:
                if m not in known:
                    raise InputError(
                        f"unknown method {m!r} for scenario {s.name!r}; expected one of "
                        f"{', '.join(known)}"
                    )


def plan_jobs(cfg: BenchConfig) -> list[Job]:
    jobs: list[Job] = []
    for sc in cfg.scenarios:
        for m in cfg.methods or method_names(sc):
            jobs += [Job(sc, m, seed, cfg.tau, cfg.tasks, cfg.half_life) for seed in cfg.seeds]
    base = cfg.scenarios[0]
    for tau in cfg.taus:
        jobs += [
            Job(base, SWEEP_METHOD, s, tau, cfg.tasks, cfg.half_life, sweep=True)
            for s in cfg.sweep_seeds
        ]
    return jobs


def execute(
    jobs: Sequence[J],
    workers: int,
    progress: Callable[[J], None] | None,
    run_one: Callable[[J], R],
) -> list[R]:
    """``run_one`` (a module-level function: it is pickled) over ``jobs``, on a process
    pool of ``workers`` (0 = one per core), results in job order; ``progress`` after each."""
    n = workers or min(len(jobs), os.cpu_count() or 1)
    if n <= 1:
        results = []
        for job in jobs:
            results.append(run_one(job))
            if progress:
                progress(job)
        return results
    with ProcessPoolExecutor(max_workers=n) as pool:
        futures = [pool.submit(run_one, j) for j in jobs]
        out = []
        for job, fut in zip(jobs, futures, strict=True):
            out.append(fut.result())
            if progress:
                progress(job)
        return out


_METRICS = (
    "all_failed_pct",
    "avg_score",
    "strict_success_pct",
    "tokens_k_per_task",
    "judge_tokens_k_per_task",
    "latency_s_per_task",
    "mean_hedge_size",
    "all_failed_pct_before",
    "all_failed_pct_after",
)


def aggregate(results: list[RunResult]) -> list[dict[str, Any]]:
    """One row per (scenario, method, τ): the mean over seeds and the per-seed values."""
    groups: dict[tuple[str, str, float], list[RunResult]] = {}
    for r in results:
        groups.setdefault((r.scenario, r.method, r.tau), []).append(r)
    rows = []
    for (scenario, method, tau), rs in groups.items():
        row: dict[str, Any] = {"scenario": scenario, "method": method, "tau": tau}
        row["seeds"] = [r.seed for r in rs]
        for k in _METRICS:
            vals = [float(getattr(r, k)) for r in rs]
            row[k] = float(np.mean(vals))
            row[f"{k}_per_seed"] = vals
        for k in (
            "zone_member_share_before",
            "zone_member_share_after",
            "zone_inclusion_before",
            "zone_inclusion_after",
        ):
            zones = getattr(rs[0], k).keys()
            row[k] = {z: float(np.mean([getattr(r, k)[z] for r in rs])) for z in zones}
        sizes: dict[int, int] = {}
        for r in rs:
            for size, count in r.hedge_sizes.items():
                sizes[size] = sizes.get(size, 0) + count
        row["hedge_sizes"] = dict(sorted(sizes.items()))
        row["change_task"] = rs[0].change_task
        row["zone_share_by_task"] = _mean_share_by_task(rs)
        rows.append(row)
    return rows


def _mean_share_by_task(rs: list[RunResult]) -> list[dict[str, float]]:
    n = min(len(r.zone_share_by_task) for r in rs)
    zones = list(rs[0].zone_share_by_task[0].keys()) if n else []
    return [
        {z: float(np.mean([r.zone_share_by_task[i][z] for r in rs])) for z in zones}
        for i in range(n)
    ]


def bench_paper(cfg: BenchConfig, progress: Callable[[Job], None] | None = None) -> dict[str, Any]:
    """Run everything and return the report (rows plus derived figures)."""
    cfg.validate()
    jobs = plan_jobs(cfg)
    t0 = time.perf_counter()
    results = execute(jobs, cfg.workers, progress, _run_job)
    wall_s = time.perf_counter() - t0
    rows = aggregate([r for r, j in zip(results, jobs, strict=True) if not j.sweep])
    sweep_rows = aggregate([r for r, j in zip(results, jobs, strict=True) if j.sweep])
    report: dict[str, Any] = {
        "config": {
            "scenarios": [s.name for s in cfg.scenarios],
            "methods": cfg.methods,
            "seeds": cfg.seeds,
            "tau": cfg.tau,
            "taus": list(cfg.taus),
            "sweep_seeds": cfg.sweep_seeds,
            "tasks": cfg.tasks,
            "half_life": None if math.isinf(cfg.half_life) else cfg.half_life,
            "runs": len(jobs),
        },
        "wall_time_s": wall_s,
        "rows": rows,
        "sweep_rows": sweep_rows,
    }
    report["figures"] = derive(cfg, rows, sweep_rows)
    return report


def write_json(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n", encoding="utf-8")
