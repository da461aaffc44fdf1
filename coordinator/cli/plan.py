"""`haco plan`: why these candidates? The allocation rule on given statistics."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from coordinator.cli.common import app, clean_errors, read_input, show
from coordinator.core.plan import parse_request
from coordinator.core.plan import plan as run_plan


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
        if decision.domains:
            d = Table(
                title=f"shared failure causes — P_succ {decision.p_success:.4f} against "
                f"{decision.p_success_indep or 0.0:.4f} if independent; achievable "
                f"{decision.achievable or 0.0:.4f}"
                + ("; spread across domains" if decision.diversified else "")
            )
            for c in ("domain", "shock", "members"):
                d.add_column(c)
            for dom in decision.domains:
                d.add_row(dom.name, f"{dom.shock:.4g}", ", ".join(dom.members))
            show(d)
    print(json.dumps(decision.model_dump(mode="json"), indent=2))
