"""`haco bench`: the simulator benchmarks. The bench package (the simulator engine,
matplotlib) is imported by the command that runs, never by `haco --help`."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from coordinator.cli.common import bench_app, clean_errors, err, show
from coordinator.errors import InputError
from sim.scenario import PAPER, load_builtin, load_scenario


def _parse_list(text: str, what: str, conv: Callable[[str], Any]) -> list[Any]:
    items = [p.strip() for p in text.split(",") if p.strip()]
    try:
        return [conv(p) for p in items]
    except ValueError as exc:
        raise InputError(f"--{what}={text!r}: {exc}") from exc


@bench_app.command("paper")
@clean_errors
def bench_paper_cmd(
    scenario: Annotated[
        list[str] | None, typer.Option(help="Built-in scenario (repeatable)")
    ] = None,
    scenario_file: Annotated[
        list[Path] | None, typer.Option(help="Scenario TOML (repeatable)")
    ] = None,
    methods: Annotated[
        str | None, typer.Option(help="Comma-separated methods (default all)")
    ] = None,
    tasks: Annotated[int | None, typer.Option(help="Tasks per run (default: scenario's)")] = None,
    seed: Annotated[int, typer.Option(help="First seed")] = 0,
    seeds: Annotated[int, typer.Option(help="How many seeds, from --seed on")] = 3,
    tau: Annotated[float, typer.Option(help="τ of the main runs")] = 0.9,
    taus: Annotated[str, typer.Option(help="τ values of the sweep ('' = no sweep)")] = (
        "0.7,0.8,0.9,0.95"
    ),
    sweep_seeds: Annotated[int, typer.Option(help="Seeds of the τ sweep, from --seed on")] = 10,
    half_life: Annotated[
        float, typer.Option(help="Profile decay half-life (observations)")
    ] = math.inf,
    workers: Annotated[int, typer.Option(help="Processes (0 = one per core)")] = 0,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the report here")] = None,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Write report.json and PNGs here")
    ] = None,
    quick: Annotated[bool, typer.Option(help="100 tasks, one seed (the demo's mode)")] = False,
) -> None:
    """Methods × scenarios × seeds in the simulator; every metric of spec §11."""
    from bench.paper import BenchConfig, bench_paper, plan_jobs, write_json
    from bench.plots import write_plots
    from bench.report import results_table

    if seeds < 1 or sweep_seeds < 1:
        raise InputError(f"--seeds={seeds}, --sweep-seeds={sweep_seeds}; expected at least 1")
    if half_life <= 0:
        raise InputError(
            f"--half-life={half_life}; expected a positive number (inf = never forget)"
        )
    if workers < 0:
        raise InputError(f"--workers={workers}; expected 0 (one per core) or more")
    loaded = [load_builtin(n) for n in scenario or []]
    loaded += [load_scenario(p) for p in scenario_file or []]
    if not loaded:  # the paper's four settings; the correlated ones are asked for by name
        loaded = [load_builtin(n) for n in PAPER]
    cfg = BenchConfig(
        scenarios=loaded,
        methods=_parse_list(methods, "methods", str) if methods else None,
        seeds=list(range(seed, seed + (1 if quick else seeds))),
        tau=tau,
        taus=_parse_list(taus, "taus", float),
        sweep_seeds=list(range(seed, seed + (1 if quick else sweep_seeds))),
        tasks=100 if quick and tasks is None else tasks,
        half_life=half_life,
        workers=workers,
    )
    cfg.validate()
    total = len(plan_jobs(cfg))
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as bar:
        tid = bar.add_task("simulating", total=total)
        report = bench_paper(cfg, progress=lambda job: bar.advance(tid))
    results_table(report, err)
    if out_dir is not None:
        write_json(report, out_dir / "report.json")
        for p in write_plots(report, out_dir):
            err.print(f"wrote {p}")
    if json_path is not None:
        write_json(report, json_path)
    print(json.dumps(report["figures"], indent=2))


@bench_app.command("decision")
@clean_errors
def bench_decision_cmd(
    sizes: Annotated[str, typer.Option(help="Pool sizes")] = "6,1000",
    batches: Annotated[int, typer.Option(help="Timed batches per case")] = 200,
) -> None:
    """Decision time of the allocation rule (median µs per decision)."""
    from bench.decision import bench_decision

    ns = _parse_list(sizes, "sizes", int)
    if not ns or any(n < 1 for n in ns):
        raise InputError(f"--sizes={sizes!r}; expected positive pool sizes")
    if batches < 5:
        raise InputError(f"--batches={batches}; expected at least 5")
    res = bench_decision(ns, batches)
    t = Table(title="decision time (µs per decision)")
    for c in ("candidates", "allocate median", "allocate p90", "from profiles median"):
        t.add_column(c, justify="right")
    for case in res["cases"]:
        t.add_row(
            str(case["candidates"]),
            f"{case['allocate']['median_us']:.1f}",
            f"{case['allocate']['p90_us']:.1f}",
            f"{case['from_profiles']['median_us']:.1f}",
        )
    show(t)
    print(json.dumps(res, indent=2))


@bench_app.command("calibration")
@clean_errors
def bench_calibration_cmd(
    scenario: Annotated[
        list[str] | None,
        typer.Option(help="Built-in scenario (repeatable; default overall and the correlated)"),
    ] = None,
    taus: Annotated[str, typer.Option(help="Comma-separated τ values")] = "0.9,0.95",
    seeds: Annotated[int, typer.Option(help="How many seeds, from 0")] = 5,
    tasks: Annotated[int, typer.Option(help="Tasks per run")] = 200,
    warm_tasks: Annotated[int, typer.Option(help="Tasks left out as warm-up")] = 50,
    workers: Annotated[int, typer.Option(help="Processes (0 = one per core)")] = 0,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Write calibration.json and reliability.png")
    ] = None,
) -> None:
    """Predicted P_succ against observed success (reliability diagram, calibration error,
    no-success rate against 1 − τ) for the paper's and the dependence-aware rule."""
    from bench.calibration import SCENARIOS, bench_calibration, parse_taus, print_table, slim
    from bench.calibration import write as write_calibration

    names = scenario or list(SCENARIOS)
    for name in names:
        if name not in SCENARIOS:
            raise InputError(f"--scenario {name!r}; expected one of {', '.join(SCENARIOS)}")
    if seeds < 1 or tasks < 1 or workers < 0:
        raise InputError(
            f"--seeds={seeds}, --tasks={tasks}, --workers={workers}; expected seeds and "
            "tasks at least 1, workers 0 (one per core) or more"
        )
    report = bench_calibration(
        names, parse_taus(taus), list(range(seeds)), tasks, warm_tasks, workers
    )
    print_table(report)
    if out_dir is not None:
        for p in write_calibration(report, out_dir):
            err.print(f"wrote {p}")
    print(json.dumps(slim(report), indent=2, allow_nan=False))


@bench_app.command("frontier")
@clean_errors
def bench_frontier_cmd(
    scenario: Annotated[str, typer.Option(help="Built-in scenario")] = "overall",
    seed: Annotated[int, typer.Option(help="First seed")] = 0,
    seeds: Annotated[int, typer.Option(help="How many seeds, from --seed on")] = 5,
    tasks: Annotated[int, typer.Option(help="Tasks per run")] = 200,
    tau: Annotated[float, typer.Option(help="τ of every HACO run")] = 0.9,
    workers: Annotated[int, typer.Option(help="Processes (0 = one per core)")] = 0,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Write frontier.json and frontier.png here")
    ] = None,
) -> None:
    """HACO's cost against MoA per launch mode (parallel, staggered, cancellation)."""
    from bench.frontier import configs, frontier, table, write

    if seeds < 1 or tasks < 1:
        raise InputError(f"--seeds={seeds}, --tasks={tasks}; expected at least 1")
    if workers < 0:
        raise InputError(f"--workers={workers}; expected 0 (one per core) or more")
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as bar:
        tid = bar.add_task("simulating", total=len(configs()) * seeds)
        report = frontier(
            load_builtin(scenario),
            list(range(seed, seed + seeds)),
            tau,
            tasks,
            workers,
            progress=lambda job: bar.advance(tid),
        )
    show(table(report))
    if out_dir is not None:
        for p in write(report, out_dir):
            err.print(f"wrote {p}")
    print(json.dumps(report, indent=2, allow_nan=False))
