"""The `haco` command line: one module per command group, assembled here. Every
deliberate error prints one clear message and exits 2.

Heavy imports (the simulator engine, matplotlib, the runtime and its drivers) are
deferred to the commands that need them, so `haco --help` stays quick.
"""

from __future__ import annotations

from typing import Annotated

import typer

from coordinator.cli import bench, files, plan
from coordinator.cli.common import app, clean_errors, err
from coordinator.cli.db import register_db
from coordinator.cli.ops import register_ops
from coordinator.cli.profiles import register_profiles
from coordinator.cli.traces import register_traces
from coordinator.errors import InputError

COMMAND_MODULES = (bench, files, plan)  # imported for their commands, registered on import


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
    from coordinator.cli.demo import run_demo  # the runtime, Celery, the workflow

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
