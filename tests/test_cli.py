"""The `haco` command line: plan, bench paper, bench decision, schema drift."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from coordinator.cli.main import app
from schemas.export import JSON_DIR, drift, export, render
from sim.scenario import builtin_path

RANKED_FIELDS = {"id", "mu", "sigma", "rho", "T_s", "C", "D", "u_plus", "r_minus", "p_success_cum"}

PLAN = {
    "tau": 0.9,
    "candidates": [
        {
            "id": "regional",
            "alpha": 8,
            "beta": 2,
            "f_int": 0.02,
            "loss": 0.015,
            "t_proc_s": 2.5,
            "bytes": 4000,
            "bandwidth_Bps": 200000,
            "jitter_Bps": 20000,
        },
        {
            "id": "global",
            "alpha": 9,
            "beta": 2,
            "f_int": 0.05,
            "loss": 0.03,
            "t_proc_s": 2.0,
            "bytes": 4000,
            "bandwidth_Bps": 40000,
            "jitter_Bps": 5000,
        },
        {"id": "local", "alpha": 4, "beta": 4, "f_int": 0.001, "loss": 0.0001, "t_proc_s": 8.0},
    ],
}


def invoke(args: list[str], stdin: str | None = None) -> Any:
    return CliRunner().invoke(app, args, input=stdin)


def assert_clean_error(res: Any, *needles: str) -> None:
    """Exit 2, nothing on stdout, one clear message on stderr, no traceback."""
    assert res.exit_code == 2, res.output
    assert res.stdout == ""
    assert res.stderr.startswith("error:")
    for needle in needles:
        assert needle in res.stderr, res.stderr
    assert "Traceback" not in res.output


def test_plan_with_domains_shows_the_dependence_terms(tmp_path: Path) -> None:
    body = {
        "tau": 0.96,
        "candidates": [
            *({"id": f"a{i}", "alpha": 321, "beta": 81} for i in range(3)),
            *({"id": f"b{i}", "alpha": 281, "beta": 121} for i in range(2)),
        ],
        "domains": [{"name": "zone:a", "members": ["a0", "a1", "a2"], "shock": 0.1}],
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(body))
    res = invoke(["plan", str(path)])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert got["diversified"] and got["p_success"] < got["p_success_indep"]
    assert sorted(got["members"]) == ["a0", "a1", "b0", "b1"]
    assert got["domains"][0]["name"] == "zone:a"
    body["domains"] = [{"name": "zone:x", "members": ["nope"], "shock": 0.1}]
    path.write_text(json.dumps(body))
    bad = invoke(["plan", str(path)])
    assert_clean_error(bad, "zone:x", "nope")


def check_decision(decision: dict[str, Any], tau: float = 0.9) -> None:
    assert set(decision) == {
        "members", "p_success", "stop", "ranking", "p_success_indep", "achievable",
        "domains", "diversified",
    }  # fmt: skip
    assert decision["domains"] == [] and decision["p_success_indep"] == decision["p_success"]
    ranking = decision["ranking"]
    assert len(ranking) == 3
    for row in ranking:
        assert set(row) == RANKED_FIELDS
    ids = [row["id"] for row in ranking]
    assert sorted(ids) == ["global", "local", "regional"]
    k = len(decision["members"])
    assert decision["members"] == ids[:k]
    assert decision["p_success"] == pytest.approx(ranking[k - 1]["p_success_cum"])
    assert decision["stop"] == "target_reached"
    assert decision["p_success"] >= tau
    u_plus = [row["u_plus"] for row in ranking]
    assert u_plus == sorted(u_plus, reverse=True)
    cum = [row["p_success_cum"] for row in ranking]
    assert cum == sorted(cum)


# ---------------------------------------------------------------- haco plan


def test_plan_from_file(tmp_path: Path) -> None:
    path = tmp_path / "req.json"
    path.write_text(json.dumps(PLAN), encoding="utf-8")
    res = invoke(["plan", str(path)])
    assert res.exit_code == 0, res.output
    check_decision(json.loads(res.stdout))
    assert res.stderr == ""


@pytest.mark.parametrize("args", [["plan", "-"], ["plan"]])
def test_plan_from_stdin(args: list[str]) -> None:
    res = invoke(args, stdin=json.dumps(PLAN))
    assert res.exit_code == 0, res.output
    decision = json.loads(res.stdout)
    check_decision(decision)
    assert decision["members"] == ["regional", "global"]


def test_plan_with_table_keeps_stdout_json() -> None:
    res = invoke(["plan", "--table", "-"], stdin=json.dumps(PLAN))
    assert res.exit_code == 0, res.output
    check_decision(json.loads(res.stdout))
    assert "hedge set" in res.stderr
    assert "regional" in res.stderr


def test_plan_exclude_and_params() -> None:
    req = {**PLAN, "exclude": ["regional"], "params": {"gamma": 0.0}}
    res = invoke(["plan"], stdin=json.dumps(req))
    assert res.exit_code == 0, res.output
    decision = json.loads(res.stdout)
    assert "regional" not in [row["id"] for row in decision["ranking"]]
    assert decision["members"][0] == "global"


def one(**fields: Any) -> dict[str, Any]:
    return {"id": "a", **fields}


BAD_PLANS: dict[str, tuple[str, list[str]]] = {
    "empty_candidates": ('{"candidates": []}', ["candidates"]),
    "tau_zero": (json.dumps({"tau": 0, "candidates": [one()]}), ["tau", "got 0"]),
    "tau_above_one": (json.dumps({"tau": 1.2, "candidates": [one()]}), ["tau", "1.2"]),
    "nan_f_int": ('{"candidates": [{"id": "a", "f_int": NaN}]}', ["f_int", "nan"]),
    "nan_alpha": ('{"candidates": [{"id": "a", "alpha": NaN}]}', ["alpha", "nan"]),
    "infinite_t_proc": ('{"candidates": [{"id": "a", "t_proc_s": Infinity}]}', ["t_proc_s"]),
    "negative_alpha": (json.dumps({"candidates": [one(alpha=-1)]}), ["alpha", "-1"]),
    "loss_above_one": (json.dumps({"candidates": [one(loss=1.5)]}), ["loss", "1.5"]),
    "duplicate_ids": (json.dumps({"candidates": [one(), one()]}), ["duplicate", "'a'"]),
    "unknown_exclude": (json.dumps({"exclude": ["zz"], "candidates": [one()]}), ["'zz'"]),
    "all_excluded": (json.dumps({"exclude": ["a"], "candidates": [one()]}), ["excluded"]),
    "unknown_param": (json.dumps({"params": {"lamda": 1}, "candidates": [one()]}), ["lamda"]),
    "tau_in_params": (json.dumps({"params": {"tau": 0.5}, "candidates": [one()]}), ["tau"]),
    "negative_param": (json.dumps({"params": {"gamma": -1}, "candidates": [one()]}), ["gamma"]),
    "unknown_candidate_key": (json.dumps({"candidates": [one(alpah=2)]}), ["alpah"]),
    "invalid_json": ('{"candidates": [', ["not valid JSON"]),
    "not_an_object": ("[1, 2]", ["(top level)"]),
}


@pytest.mark.parametrize("case", list(BAD_PLANS))
def test_plan_bad_input_exits_2(case: str) -> None:
    text, needles = BAD_PLANS[case]
    assert_clean_error(invoke(["plan", "-"], stdin=text), *needles)


def test_plan_bad_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"tau": 2, "candidates": [{"id": "a"}]}', encoding="utf-8")
    assert_clean_error(invoke(["plan", str(path)]), "broken.json", "tau")


def test_plan_missing_file_exits_2(tmp_path: Path) -> None:
    assert_clean_error(invoke(["plan", str(tmp_path / "nope.json")]), "nope.json")


def test_installed_command_reports_cleanly() -> None:
    haco = Path(sys.executable).with_name("haco")
    assert haco.exists(), f"no haco entry point beside {sys.executable}: pip install -e ."
    bad = subprocess.run(
        [str(haco), "plan", "-"],
        input='{"tau": 1.2, "candidates": [{"id": "a"}]}',
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert "1.2" in bad.stderr and "Traceback" not in bad.stderr
    good = subprocess.run(
        [str(haco), "plan", "-"],
        input=json.dumps(PLAN),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    check_decision(json.loads(good.stdout))


# ---------------------------------------------------------------- haco bench paper

BENCH = ["bench", "paper", "--scenario", "overall", "--tasks", "20", "--seeds", "1"]


def test_bench_paper_writes_report_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "out"
    opts = ["--methods", "haco,moa", "--taus", "0.9", "--workers", "1", "--out", str(out)]
    res = invoke([*BENCH, *opts, "--json", str(tmp_path / "copy.json")])
    assert res.exit_code == 0, res.output
    figures = json.loads(res.stdout)
    for key in ("base_scenario", "fixed_zone_vs_analytic", "overall", "degradations"):
        assert key in figures
    assert figures["base_scenario"] == "overall"
    assert [p["tau"] for p in figures["tau_sweep"]["points"]] == [0.9]
    assert figures["overall"]["haco_tokens_over_moa"] < 1.0
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert report == json.loads((tmp_path / "copy.json").read_text(encoding="utf-8"))
    assert report["figures"] == figures
    assert {(r["method"], r["tau"]) for r in report["rows"]} == {("haco", 0.9), ("moa", 0.9)}
    assert report["config"]["tasks"] == 20
    pngs = sorted(out.glob("*.png"))
    assert {p.name for p in pngs} >= {"all_failed.png", "tau_sweep.png", "zone_share.png"}
    for png in pngs:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (["--scenario", "nosuch"], ["'nosuch'"]),
        (["--methods", "nosuch"], ["'nosuch'"]),
        (["--tau", "1.0"], ["tau=1.0"]),
        (["--tau", "0"], ["tau=0"]),
        (["--taus", "0.5,abc"], ["abc"]),
        (["--seeds", "0"], ["--seeds=0"]),
        (["--half-life", "0"], ["--half-life"]),
        (["--tasks", "0"], ["tasks=0"]),
    ],
)
def test_bench_paper_bad_options_exit_2(extra: list[str], needles: list[str]) -> None:
    args = ["bench", "paper", "--scenario", "overall", *extra]
    if "--scenario" in extra:
        args = ["bench", "paper", *extra]
    assert_clean_error(invoke(args), *needles)


def test_bench_paper_bad_scenario_file_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('name = "x"\nzones = [\n', encoding="utf-8")
    assert_clean_error(invoke(["bench", "paper", "--scenario-file", str(path)]), "bad.toml")


def test_bench_paper_scenario_missing_a_workflow_role_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "coder_only.toml"
    path.write_text(
        f'extends = "{builtin_path("overall").as_posix()}"\nname = "coder_only"\n'
        '[[candidates]]\nid = "c1"\nrole = "coder"\nmodel = "gpt-4o"\nzone = "local"\n',
        encoding="utf-8",
    )
    assert invoke(["scenarios", "validate", str(path)]).exit_code == 0
    opts = ["--methods", "haco", "--tasks", "2", "--seeds", "1", "--taus", "0.9", "--workers", "1"]
    res = invoke(["bench", "paper", "--scenario-file", str(path), *opts])
    assert_clean_error(res, "planner")


# ---------------------------------------------------------------- haco bench decision


def test_bench_decision_prints_positive_medians() -> None:
    res = invoke(["bench", "decision", "--sizes", "6", "--batches", "5"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["sizes"] == [6] and data["batches"] == 5
    (case,) = data["cases"]
    assert case["candidates"] == 6
    for part in ("allocate", "from_profiles"):
        assert case[part]["median_us"] > 0.0
        assert case[part]["min_us"] <= case[part]["median_us"] <= case[part]["p90_us"]
    assert "decision time" in res.stderr


@pytest.mark.parametrize(
    ("extra", "needle"),
    [(["--sizes", "0"], "--sizes"), (["--sizes", "six"], "six"), (["--batches", "2"], "--batches")],
)
def test_bench_decision_bad_options_exit_2(extra: list[str], needle: str) -> None:
    assert_clean_error(invoke(["bench", "decision", *extra]), needle)


# ---------------------------------------------------------------- schema drift


def test_committed_schemas_match_the_models() -> None:
    assert drift() == []
    assert sorted(p.name for p in JSON_DIR.glob("*.schema.json")) == sorted(render())
    res = invoke(["schemas", "export", "--check"])
    assert res.exit_code == 0, res.output


def test_drift_reports_altered_missing_and_extra_files(tmp_path: Path) -> None:
    assert sorted(p.name for p in export(tmp_path)) == sorted(render())
    assert drift(tmp_path) == []
    altered = tmp_path / "candidate.schema.json"
    schema = json.loads(altered.read_text(encoding="utf-8"))
    schema["title"] = "Renamed"
    altered.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    assert drift(tmp_path) == ["candidate.schema.json: differs from the model"]
    (tmp_path / "zone_link.schema.json").unlink()
    (tmp_path / "stale.schema.json").write_text("{}\n", encoding="utf-8")
    assert drift(tmp_path) == [
        "candidate.schema.json: differs from the model",
        "zone_link.schema.json: missing",
        "stale.schema.json: no model exports it",
    ]
