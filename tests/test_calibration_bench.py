"""`haco bench calibration`: the calibration error and a tiny end-to-end run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from bench.calibration import ece_points, parse_taus
from coordinator.cli.main import app
from coordinator.errors import InputError


def test_a_calibrated_forecast_has_no_error_and_a_biased_one_its_bias() -> None:
    rng = np.random.default_rng(0)
    p = rng.uniform(0.5, 1.0, 200_000)
    ok = rng.random(p.shape) < p
    err, bins = ece_points(p, ok.astype(float))
    assert err < 0.5
    assert sum(b["n"] for b in bins) == p.size
    # Outcomes 5 points worse than forecast everywhere: an error of 5 points.
    worse = rng.random(p.shape) < p - 0.05
    assert ece_points(p, worse.astype(float))[0] == pytest.approx(5.0, abs=0.5)


def test_taus_are_validated() -> None:
    assert parse_taus("0.9, 0.95") == [0.9, 0.95]
    for bad in ("", "x", "1.0", "0"):
        with pytest.raises(InputError):
            parse_taus(bad)


def test_the_command_runs_both_rules_and_writes_the_diagram(tmp_path: Path) -> None:
    args = ["bench", "calibration", "--scenario", "overall", "--taus", "0.9", "--seeds", "1",
            "--tasks", "30", "--warm-tasks", "5", "--workers", "1",
            "--out", str(tmp_path)]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    rules = {r["rule"] for r in report["rows"]}
    assert rules == {"haco", "haco-indep", "haco-saturate"}
    for row in report["rows"]:
        assert 0.0 <= row["calibration_error_points"] <= 100.0
        assert row["decisions"] > 0 and row["target_pct"] == pytest.approx(10.0)
    assert (tmp_path / "reliability.png").stat().st_size > 0
    saved = json.loads((tmp_path / "calibration.json").read_text())
    assert saved["rows"][0]["bins"]
    bad = CliRunner().invoke(app, ["bench", "calibration", "--warm-tasks", "300", "--tasks", "30"])
    assert bad.exit_code == 2 and "warm_tasks=300" in bad.stderr
