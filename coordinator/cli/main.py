"""The `haco` command line. Every deliberate error prints one clear message and exits 2."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from bench.decision import bench_decision
from bench.paper import BenchConfig, bench_paper, plan_jobs, write_json
from bench.plots import write_plots
from bench.report import results_table
from coordinator.cli.common import (
    app,
    bench_app,
    clean_errors,
    err,
    out,
    read_input,
    scenarios_app,
    schemas_app,
    show,
)
from coordinator.cli.db import register_db
from coordinator.cli.demo import run_demo
from coordinator.cli.ops import register_ops
from coordinator.cli.profiles import register_profiles
from coordinator.cli.traces import register_traces
from coordinator.core.plan import parse_request
from coordinator.core.plan import plan as run_plan
from coordinator.errors import InputError
from schemas.export import drift, export
from sim.scenario import BUILTIN, builtin_path, load_builtin, load_scenario
from sim.world import SimWorld


@app.command()
@clean_errors
def plan(
    source: Annotated[str, typer.Argument(help="JSON request file, or - for stdin")] = "-",
    table: Annotated[bool, typer.Option("--table", help="Also print a table")] = False,
) -> None:
    """Why these candidates? Run the allocation rule on given statistics and explain it."""

    text, name = read_input(source)
    decision = run_plan(parse_request(text, name))
    if table:
        t = Table(
            title=f"hedge set: {decision.members} — P_succ={decision.p_success:.4f} "
            f"({decision.stop.value})"
        )
        cols = ("id", "mu", "sigma", "rho", "T_s", "C", "D", "u_plus", "r_minus", "p_success_cum")
        for c in cols:
            t.add_column(c, justify="left" if c == "id" else "right")
        chosen = set(decision.members)
        for r in decision.ranking:
            vals = r.model_dump()
            style = "bold green" if r.id in chosen else None
            t.add_row(r.id, *[f"{vals[c]:.4g}" for c in cols[1:]], style=style)
        show(t)
    print(json.dumps(decision.model_dump(mode="json"), indent=2))


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
    if not loaded:
        loaded = [load_builtin(n) for n in BUILTIN]
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


@scenarios_app.command("list")
def scenarios_list() -> None:
    """The built-in scenarios (the paper's four settings)."""

    for name in BUILTIN:
        out.print(f"{name}\t{builtin_path(name)}")


@scenarios_app.command("validate")
@clean_errors
def scenarios_validate(path: Annotated[Path, typer.Argument(help="Scenario TOML")]) -> None:
    """Load a scenario file and report what it describes, or every problem in it."""

    s = load_scenario(path)
    SimWorld(s)  # loads every model, so a missing or malformed trace file is reported too
    out.print(
        f"{s.name}: {len(s.candidates)} candidates in roles {s.roles}, zones {s.zones}, "
        f"{len(s.links)} links, {len(s.changes)} timed changes, {s.workload.tasks} tasks"
    )


@schemas_app.command("export")
@clean_errors
def schemas_export(
    check: Annotated[bool, typer.Option(help="Only compare; exit 1 on drift")] = False,
) -> None:
    """Write schemas/json/*.schema.json from the models (or check they match)."""

    if check:
        problems = drift()
        for problem in problems:
            err.print(problem)
        raise typer.Exit(code=1 if problems else 0)
    for path in export():
        out.print(f"wrote {path}")


@app.command()
@clean_errors
def demo(
    tasks: Annotated[int, typer.Option(help="Workflow tasks per method")] = 60,
    outage: Annotated[str, typer.Option(help="ZONE@TASK: zone outage from that task")] = (
        "global@20"
    ),
    time_scale: Annotated[float, typer.Option(help="Simulated time per model second")] = 0.02,
) -> None:
    """The workflow through the real distributed path (embedded Redis, a worker per
    zone), HACO against a single route, with a zone outage partway."""
    if not 0 < time_scale <= 1:
        raise InputError(f"--time-scale={time_scale}; expected a number in (0, 1]")
    run_demo(tasks, outage, time_scale, err)


register_ops(app)
register_db(app)
register_traces(app)
register_profiles(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
