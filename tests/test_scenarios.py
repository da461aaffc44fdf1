"""Scenario files (spec §9): the built-in settings, `extends`, and every rejection."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from coordinator.cli.main import app
from coordinator.errors import ScenarioError
from schemas.models import link_key
from schemas.scenario import (
    CandidateChange,
    EvaluatorChange,
    LinkChange,
    Scenario,
    TraceLatency,
)
from sim.scenario import BUILTIN, PAPER, builtin_path, load_builtin, load_scenario

ROLES = ["coder", "debugger", "filter", "planner"]

# Spec §9, paper Table 5: latency ms, jitter ms, bandwidth tokens/ms, loss.
PAPER_LINKS = {
    ("local", "local"): (2, 1, 500, 0.0001),
    ("local", "regional"): (150, 30, 50, 0.015),
    ("global", "local"): (500, 150, 10, 0.03),
    ("regional", "regional"): (40, 10, 100, 0.005),
    ("global", "regional"): (350, 60, 20, 0.008),
    ("global", "global"): (60, 15, 200, 0.001),
}

# Spec §9, paper Table 4: failure rates per role, (global, regional, local) pairs.
PAPER_FAILURES = {
    "planner": ((0.05, 0.15), (0.02, 0.09), (0.001, 0.03)),
    "coder": ((0.06, 0.16), (0.05, 0.10), (0.001, 0.05)),
    "debugger": ((0.05, 0.12), (0.02, 0.10), (0.001, 0.04)),
    "filter": ((0.04, 0.12), (0.02, 0.08), (0.001, 0.03)),
}
ZONE_MODEL = {"global": "gpt-4o", "regional": "gpt-4o-mini", "local": "llama-3.1-8b-instruct"}

MINI = """
name = "mini"
caller_zone = "local"
zones = ["local", "global"]

[[links]]
a = "local"
b = "local"
latency_ms = 2
jitter_ms = 1
bandwidth_tokens_per_ms = 500
loss = 0.0

[[links]]
a = "local"
b = "global"
latency_ms = 500
jitter_ms = 150
bandwidth_tokens_per_ms = 10
loss = 0.03

[models.m1]
quality = { mean = 0.6, concentration = 10 }
latency = { kind = "lognormal", median_s = 1.0, sigma = 0.5 }
tokens_out = { median = 100, sigma = 0.2 }

[evaluator]
model = "m1"
zone = "local"

[[candidates]]
id = "c1"
role = "coder"
model = "m1"
zone = "local"
failure_rate = 0.1

[[candidates]]
id = "c2"
role = "coder"
model = "m1"
zone = "global"
failure_rate = 0.2
"""


def write(tmp_path: Path, text: str, name: str = "scenario.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- built-in scenarios


def test_overall_has_the_paper_pool() -> None:
    s = load_builtin("overall")
    assert s.caller_zone == "local"
    assert sorted(s.zones) == ["global", "local", "regional"]
    assert len(s.candidates) == 24
    assert s.roles == ROLES
    assert Counter(c.role for c in s.candidates) == dict.fromkeys(ROLES, 6)
    for role, per_zone in PAPER_FAILURES.items():
        for zone, rates in zip(("global", "regional", "local"), per_zone, strict=True):
            mine = [c for c in s.candidates if c.role == role and c.zone == zone]
            assert sorted(c.failure_rate for c in mine) == sorted(rates)
            assert {c.model for c in mine} == {ZONE_MODEL[zone]}
    assert s.evaluator.model == "gpt-4o" and s.evaluator.zone == "local"
    assert s.changes == []


def test_overall_has_the_paper_link_table() -> None:
    s = load_builtin("overall")
    got = {
        link.key: (link.latency_ms, link.jitter_ms, link.bandwidth_tokens_per_ms, link.loss)
        for link in s.links
    }
    assert got == PAPER_LINKS
    assert s.network.t_min_factor == 0.5
    assert s.network.timeout_s == 5.0
    assert s.network.bytes_per_token == 4.0


def test_overall_fixed_zone_baselines() -> None:
    fixed = {f.name: (f.zone, f.model, f.failure_rate) for f in load_builtin("overall").fixed_zone}
    assert fixed == {
        "local": ("local", "llama-3.1-8b-instruct", 0.001),
        "regional": ("regional", "gpt-4o-mini", 0.02),
        "global": ("global", "gpt-4o", 0.05),
    }


@pytest.mark.parametrize("name", [n for n in PAPER if n != "overall"])
def test_degradations_inherit_the_pool_and_change_at_task_50(name: str) -> None:
    overall = load_builtin("overall")
    s = load_builtin(name)
    assert s.name == name
    assert s.candidates == overall.candidates
    assert s.links == overall.links
    assert s.models == overall.models
    assert s.fixed_zone == overall.fixed_zone
    assert s.changes
    assert {ch.at_task for ch in s.changes} == {50}
    assert s.first_change_task == 50
    assert "extends" in builtin_path(name).read_text(encoding="utf-8")


def test_candidate_degradation_content() -> None:
    s = load_builtin("candidate_degradation")
    assert all(isinstance(ch, CandidateChange) for ch in s.changes)
    broken = {ch.candidate: ch.failure_rate for ch in s.changes if isinstance(ch, CandidateChange)}
    assert broken == {"planner-global-1": 1.0, "planner-global-2": 1.0, "coder-global-1": 1.0}


def test_network_degradation_content() -> None:
    s = load_builtin("network_degradation")
    changes = {link_key(ch.a, ch.b): ch for ch in s.changes if isinstance(ch, LinkChange)}
    assert len(changes) == len(s.changes)
    for key in (("global", "local"), ("global", "regional"), ("global", "global")):
        assert changes[key].loss == 1.0
    lr = changes[("local", "regional")]
    assert (lr.latency_ms, lr.jitter_ms, lr.bandwidth_tokens_per_ms, lr.loss) == (
        60,
        10,
        150,
        0.003,
    )
    rr = changes[("regional", "regional")]
    assert (rr.latency_ms, rr.jitter_ms, rr.bandwidth_tokens_per_ms, rr.loss) == (
        15,
        4,
        220,
        0.0008,
    )


def test_evaluator_degradation_content() -> None:
    (ch,) = load_builtin("evaluator_degradation").changes
    assert isinstance(ch, EvaluatorChange)
    assert (ch.model, ch.zone) == ("llama-3.1-8b-instruct", "local")


def test_unknown_builtin_is_named() -> None:
    with pytest.raises(ScenarioError, match="'nosuch'"):
        load_builtin("nosuch")


# ---------------------------------------------------------------- extends


def test_extends_merges_tables_and_replaces_arrays(tmp_path: Path) -> None:
    text = f"""
extends = "{builtin_path("overall").as_posix()}"
name = "custom"

[workload]
tasks = 12

[[changes]]
kind = "candidate"
at_task = 5
candidate = "coder-local-1"
failure_rate = 1.0
"""
    s = load_scenario(write(tmp_path, text))
    overall = load_builtin("overall")
    assert s.name == "custom"
    assert s.candidates == overall.candidates
    assert s.workload.tasks == 12
    assert s.workload.max_invocation_retries == overall.workload.max_invocation_retries
    assert [(ch.at_task, ch.kind) for ch in s.changes] == [(5, "candidate")]


def test_extends_relative_to_the_file(tmp_path: Path) -> None:
    write(tmp_path, MINI, "base.toml")
    sub = tmp_path / "variants"
    sub.mkdir()
    s = load_scenario(write(sub, 'extends = "../base.toml"\nname = "child"\n'))
    assert s.name == "child"
    assert [c.id for c in s.candidates] == ["c1", "c2"]


def test_trace_files_resolve_relative_to_the_scenario(tmp_path: Path) -> None:
    text = MINI.replace(
        'latency = { kind = "lognormal", median_s = 1.0, sigma = 0.5 }',
        'latency = { kind = "trace", file = "traces/x.json" }',
    )
    s = load_scenario(write(tmp_path, text))
    latency = s.models["m1"].latency
    assert isinstance(latency, TraceLatency)
    assert Path(latency.file) == (tmp_path / "traces" / "x.json").resolve()


def test_extends_cycle_is_rejected(tmp_path: Path) -> None:
    write(tmp_path, 'extends = "b.toml"\nname = "a"\n', "a.toml")
    write(tmp_path, 'extends = "a.toml"\nname = "b"\n', "b.toml")
    with pytest.raises(ScenarioError, match="extends"):
        load_scenario(tmp_path / "a.toml")


# ---------------------------------------------------------------- rejections

CHANGE_GHOST = """
[[changes]]
kind = "candidate"
at_task = 5
candidate = "ghost"
failure_rate = 1.0
"""

BAD_CASES = {
    "unknown_link_zone": (MINI.replace('b = "global"', 'b = "mars"'), ["'mars'", "link"]),
    "failure_rate_above_1": (MINI.replace("failure_rate = 0.2", "failure_rate = 1.5"), ["1.5"]),
    "failure_rate_negative": (
        MINI.replace("failure_rate = 0.2", "failure_rate = -0.1"),
        ["-0.1", "failure_rate"],
    ),
    "duplicate_id": (MINI.replace('id = "c2"', 'id = "c1"'), ["duplicate", "'c1'"]),
    "undefined_model": (
        MINI.replace('model = "m1"\nzone = "global"', 'model = "gpt-9"\nzone = "global"'),
        ["'gpt-9'", "'c2'"],
    ),
    "typo_top_level": (
        MINI.replace('name = "mini"', 'name = "mini"\ndescripton = "x"'),
        ["descripton"],
    ),
    "typo_in_table": (MINI + "\n[workload]\ntaks = 10\n", ["taks"]),
    "invalid_toml": (MINI + "\n[[candidates]\n", ["not valid TOML"]),
    "unknown_change_candidate": (MINI + CHANGE_GHOST, ["'ghost'", "task 5"]),
    "extends_missing": (
        'extends = "nowhere.toml"\nname = "x"\n',
        ["nowhere.toml", "does not exist"],
    ),
    "nan_latency": (MINI.replace("latency_ms = 500", "latency_ms = nan"), ["latency_ms"]),
    "steps_inverted": (
        MINI + "\n[workload]\nsteps_min = 5\nsteps_max = 2\n",
        ["steps_min=5", "steps_max=2"],
    ),
    "no_link_to_candidate_zone": (
        MINI.replace('a = "local"\nb = "global"', 'a = "global"\nb = "global"'),
        ["'c2'", "no link"],
    ),
}


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_scenario_raises_naming_the_value(tmp_path: Path, case: str) -> None:
    text, needles = BAD_CASES[case]
    path = write(tmp_path, text, f"{case}.toml")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    message = str(info.value)
    for needle in needles:
        assert needle in message
    assert "Traceback" not in message


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"absent\.toml.*does not exist"):
        load_scenario(tmp_path / "absent.toml")


def test_minimal_scenario_is_valid(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, MINI))
    assert isinstance(s, Scenario)
    assert [c.id for c in s.candidates] == ["c1", "c2"]
    assert s.first_change_task is None


def test_fixed_zone_without_a_link_to_the_caller_is_rejected(tmp_path: Path) -> None:
    text = MINI.replace('zones = ["local", "global"]', 'zones = ["local", "global", "mars"]')
    text += '\n[[fixed_zone]]\nname = "mars"\nzone = "mars"\nmodel = "m1"\nfailure_rate = 0.0\n'
    with pytest.raises(ScenarioError, match="mars"):
        load_scenario(write(tmp_path, text))


# ---------------------------------------------------------------- haco scenarios validate


def test_cli_validate_good_file(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["scenarios", "validate", str(write(tmp_path, MINI))])
    assert res.exit_code == 0, res.output
    assert "mini" in res.stdout
    assert "2 candidates" in res.stdout
    assert res.stderr == ""


def test_cli_validate_builtin_file() -> None:
    res = CliRunner().invoke(app, ["scenarios", "validate", str(builtin_path("overall"))])
    assert res.exit_code == 0, res.output
    assert "24 candidates" in res.stdout


@pytest.mark.parametrize("case", ["failure_rate_above_1", "invalid_toml", "unknown_link_zone"])
def test_cli_validate_bad_file_exits_2(tmp_path: Path, case: str) -> None:
    text, needles = BAD_CASES[case]
    path = write(tmp_path, text, f"{case}.toml")
    res = CliRunner().invoke(app, ["scenarios", "validate", str(path)])
    assert res.exit_code == 2
    assert res.stdout == ""
    assert "error:" in res.stderr
    assert f"{case}.toml" in res.stderr
    for needle in needles:
        assert needle in res.stderr
    assert "Traceback" not in res.output


def test_cli_validate_missing_file_exits_2(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["scenarios", "validate", str(tmp_path / "absent.toml")])
    assert res.exit_code == 2
    assert "absent.toml" in res.stderr
    assert "Traceback" not in res.output


def test_cli_list_names_every_builtin() -> None:
    res = CliRunner().invoke(app, ["scenarios", "list"])
    assert res.exit_code == 0
    for name in BUILTIN:
        assert name in res.stdout
