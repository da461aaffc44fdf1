"""What the entry points load: the SDK and a worker load neither matplotlib nor the
discrete-event engine; the pure core loads no I/O driver either. Each check runs in a
fresh interpreter on this checkout (the test process has imported everything already).
The import times are measured by `python -m bench.imports` (docs/BENCHMARKS.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLOTS_AND_ENGINE = {"matplotlib", "sim.engine", "sim.runner"}
DRIVERS = {"redis", "celery", "kombu", "psycopg", "psycopg_pool", "httpx"}
NO_SERVER = "redis://127.0.0.1:9/0"  # never connected to: creating the app needs no services


def loaded_after(code: str) -> set[str]:
    """The modules in ``sys.modules`` after running ``code`` in a fresh interpreter."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout.splitlines()[-1]))


SDK = """
from coordinator import HacoClient
assert HacoClient.__module__ == "coordinator.runtime.client"
"""

WORKER = f"""
import workers.app
from coordinator.config import HacoSettings
from coordinator.state.keys import MEMBER_TASK
app = workers.app.create_app(HacoSettings(), {NO_SERVER!r})
assert MEMBER_TASK in app.tasks
"""

# What `haco worker` (the command `haco up` runs per zone) imports before Celery starts.
WORKER_PROCESS = f"""
import coordinator.cli.main
from coordinator.cli.ops import worker_cmd
from coordinator.config import HacoSettings
from workers.app import create_app
create_app(HacoSettings(), {NO_SERVER!r})
"""

CORE = "import coordinator, coordinator.core.policy, coordinator.core.plan"


@pytest.mark.parametrize(
    ("code", "forbidden"),
    [
        (SDK, PLOTS_AND_ENGINE),
        (WORKER, PLOTS_AND_ENGINE | {"bench", "coordinator.cli"}),
        (WORKER_PROCESS, PLOTS_AND_ENGINE | {"bench"}),
        (CORE, PLOTS_AND_ENGINE | DRIVERS | {"sim", "coordinator.runtime"}),
    ],
    ids=["sdk", "worker", "worker-process", "core"],
)
def test_entry_point_loads_nothing_forbidden(code: str, forbidden: set[str]) -> None:
    modules = loaded_after(code)
    assert modules & forbidden == set()


def test_the_probe_sees_what_is_loaded() -> None:
    modules = loaded_after("import sim.runner")
    assert {"sim.engine", "sim.runner"} <= modules
    assert "coordinator" in loaded_after(SDK)
