"""`haco scenarios` and `haco schemas`: the simulator's scenario files and the exported
JSON Schemas of the message models."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from coordinator.cli.common import clean_errors, err, out, scenarios_app, schemas_app
from schemas.export import drift, export
from sim.scenario import BUILTIN, builtin_path, load_scenario
from sim.world import SimWorld


@scenarios_app.command("list")
def scenarios_list() -> None:
    """The built-in scenarios: the paper's four settings, then the correlated-failure ones."""

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
        f"{len(s.links)} links, {len(s.changes)} timed changes, {len(s.shocks)} shocks, "
        f"{len(s.hardness)} hardness tiers, {s.workload.tasks} tasks"
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
