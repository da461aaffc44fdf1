"""The simulated world, the discrete-event engine, the runner (spec §9, §11) and the
DATAWISE-style workflow controller (spec §10)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from bench.report import analytic_fixed_zone
from coordinator.core.params import PolicyParams
from coordinator.errors import InputError
from schemas.enums import FailureKind
from schemas.scenario import Scenario, WorkloadSpec
from sim.network import LinkState
from sim.runner import RunResult, method_names, run
from sim.scenario import builtin_path, load_builtin, load_scenario
from sim.workflow import (
    Controller,
    Invocation,
    PlanSignal,
    State,
    StepResult,
    TaskOutcome,
    datawise_task,
)
from sim.world import SimWorld


@pytest.fixture(scope="module")
def overall() -> Scenario:
    return load_builtin("overall")


def with_changes(tmp_path: Path, changes: str) -> Scenario:
    """The overall scenario with extra timed changes, through `extends`."""
    text = f'extends = "{builtin_path("overall").as_posix()}"\nname = "custom"\n{changes}'
    path = tmp_path / "custom.toml"
    path.write_text(text, encoding="utf-8")
    return load_scenario(path)


CODER_OUTAGE_AT_5 = """
[[changes]]
kind = "candidate"
at_task = 5
candidate = "coder-local-1"
failure_rate = 1.0
"""

GLOBAL_LINK_OUTAGE_AT_5 = """
[[changes]]
kind = "link"
at_task = 5
a = "local"
b = "global"
loss = 1.0
"""


# ---------------------------------------------------------------- determinism, virtual time


@pytest.mark.parametrize("method", ["haco", "random", "bestone"])
def test_same_seed_same_result(overall: Scenario, method: str) -> None:
    a = run(overall, method, seed=3, tasks=30)
    b = run(overall, method, seed=3, tasks=30)
    assert a == b
    assert a.to_dict() == b.to_dict()
    c = run(overall, method, seed=4, tasks=30)
    assert c != a
    assert (c.tokens_k_per_task, c.invocations) != (a.tokens_k_per_task, a.invocations)


def test_runs_in_virtual_time_without_sleeping(
    overall: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_sleep(seconds: float) -> None:
        raise AssertionError(f"the simulator slept {seconds} s of wall time")

    monkeypatch.setattr(time, "sleep", no_sleep)
    res = run(overall, "haco", seed=0, tasks=30)
    assert res.tasks == 30
    assert res.latency_s_per_task > 0.0
    assert res.invocations >= 30 * 5  # plan, code, update per step, at least two steps
    assert res.avg_score > 0.0


def test_run_result_shape(overall: Scenario) -> None:
    res = run(overall, "haco", seed=1, tasks=20)
    assert isinstance(res, RunResult)
    assert res.scenario == "overall" and res.method == "haco" and res.tau == 0.9
    assert sum(res.hedge_sizes.values()) == res.invocations
    assert len(res.zone_share_by_task) == 20
    assert res.change_task is None
    for share in (res.zone_member_share_before, res.zone_member_share_after):
        assert set(share) == set(overall.zones)
        assert sum(share.values()) == pytest.approx(100.0)
    assert 0.0 <= res.strict_success_pct <= 100.0


def test_unknown_method_and_zero_tasks_are_input_errors(overall: Scenario) -> None:
    with pytest.raises(InputError, match="'nosuch'"):
        run(overall, "nosuch", tasks=1)
    with pytest.raises(InputError, match="tasks=0"):
        run(overall, "haco", tasks=0)
    assert {"haco", "moa", "fixed-local", "fixed-regional", "fixed-global"} <= set(
        method_names(overall)
    )


# ---------------------------------------------------------------- timed changes


def test_world_applies_a_candidate_change_at_its_task(tmp_path: Path) -> None:
    scenario = with_changes(tmp_path, CODER_OUTAGE_AT_5)
    world = SimWorld(scenario)
    coder = next(c for c in scenario.candidates if c.id == "coder-local-1")
    rng = np.random.default_rng(0)
    before = [world.call(coder, 2_000.0, rng).failure for _ in range(300)]
    assert sum(f is not None for f in before) < 10
    assert world.apply_changes(4) == []
    assert world.apply_changes(5) == ["candidate coder-local-1"]
    assert world.apply_changes(5) == []  # a change switches on once
    after = [world.call(coder, 2_000.0, rng).failure for _ in range(300)]
    assert all(f is not None for f in after)
    assert after.count(FailureKind.INTERNAL) >= 295  # the local link loses 0.01%
    other = next(c for c in scenario.candidates if c.id == "coder-local-2")
    assert world.failure_rate[other.id] == other.failure_rate


def test_world_applies_builtin_degradations() -> None:
    net = SimWorld(load_builtin("network_degradation"))
    assert net.link_to("global").loss == 0.03
    assert net.apply_changes(49) == []
    assert len(net.apply_changes(50)) == 5
    assert net.link_to("global").loss == 1.0
    assert net.link_to("regional") == LinkState(60.0, 10.0, 150.0, 0.003)
    assert net.links[("regional", "regional")] == LinkState(15.0, 4.0, 220.0, 0.0008)
    ev = SimWorld(load_builtin("evaluator_degradation"))
    assert ev.judge_noise() == 0.05
    assert ev.apply_changes(50) == ["evaluator llama-3.1-8b-instruct"]
    assert ev.judge_noise() == 0.30
    cand = SimWorld(load_builtin("candidate_degradation"))
    cand.apply_changes(50)
    assert cand.failure_rate["planner-global-1"] == 1.0
    assert cand.failure_rate["coder-global-2"] == 0.16


def test_fixed_zone_fails_every_step_after_a_link_outage(tmp_path: Path) -> None:
    scenario = with_changes(tmp_path, GLOBAL_LINK_OUTAGE_AT_5)
    res = run(scenario, "fixed-global", seed=0, tasks=12)
    assert res.change_task == 5
    assert res.all_failed_pct_before < 30.0
    assert res.all_failed_pct_after == 100.0
    # Tasks after the outage abort after 1 + max_invocation_retries attempts.
    assert res.strict_success_pct <= 100.0 * 5 / 12
    unaffected = run(scenario, "fixed-regional", seed=0, tasks=12)
    assert unaffected.all_failed_pct_after < 30.0


# ---------------------------------------------------------------- paper figures


@pytest.mark.parametrize(
    ("method", "analytic_pct"),
    [("fixed-global", 7.85), ("fixed-regional", 3.47), ("fixed-local", 0.11)],
)
def test_fixed_zone_all_failed_rate_is_analytic(
    overall: Scenario, method: str, analytic_pct: float
) -> None:
    exact = analytic_fixed_zone(overall)[method]
    assert exact == pytest.approx(analytic_pct, abs=0.01)
    runs = [run(overall, method, seed=s, tasks=150) for s in range(3)]
    steps = sum(r.invocations for r in runs)
    failed = sum(r.all_failed_pct * r.invocations / 100.0 for r in runs)
    assert abs(100.0 * failed / steps - exact) <= 2.0
    assert all(r.mean_hedge_size == 1.0 for r in runs)


def test_moa_never_all_fails(overall: Scenario) -> None:
    res = run(overall, "moa", seed=0, tasks=100)
    assert res.all_failed_pct == 0.0
    assert res.hedge_sizes == {6: res.invocations}
    assert res.judge_tokens_k_per_task > 0.0


def test_haco_hedges_less_than_moa(overall: Scenario) -> None:
    haco = run(overall, "haco", seed=0, params=PolicyParams(tau=0.9), tasks=60)
    moa = run(overall, "moa", seed=0, tasks=60)
    assert 1.0 < haco.mean_hedge_size < 6.0
    assert haco.tokens_k_per_task < moa.tokens_k_per_task
    assert haco.all_failed_pct < analytic_fixed_zone(overall)["fixed-regional"]


# ---------------------------------------------------------------- workflow controller

WORKLOAD = WorkloadSpec(
    steps_min=2,
    steps_max=2,
    max_debug_rounds=1,
    max_step_iterations=2,
    max_invocation_retries=2,
    code_difficulty=1.0,
    prompt_bytes=1_000,
    context_bytes_cap=3_000,
)

Responder = Callable[[Invocation], StepResult]


def drive(
    responder: Responder, spec: WorkloadSpec = WORKLOAD
) -> tuple[TaskOutcome, list[Invocation]]:
    ctl: Controller = datawise_task(spec, np.random.default_rng(0), bytes_per_token=4.0)
    seen: list[Invocation] = []
    try:
        inv = next(ctl)
        while True:
            seen.append(inv)
            inv = ctl.send(responder(inv))
    except StopIteration as stop:
        return stop.value, seen


def by_role(quality: dict[str, float], tokens: int = 200) -> Responder:
    return lambda inv: StepResult(True, quality[inv.role], tokens)


def test_all_failed_invocation_is_retried_then_the_task_aborts() -> None:
    out, seen = drive(lambda inv: StepResult(ok=False))
    assert [inv.state for inv in seen] == [State.INITIATE_PLAN] * 3
    assert out.aborted and not out.completed
    assert out.invocations == 3 and out.all_failed == 3
    assert out.score == 0.0 and not out.strict_success


def test_abort_in_the_middle_of_a_task() -> None:
    def coder_down(inv: Invocation) -> StepResult:
        return StepResult(inv.role != "coder", 0.9, 100)

    out, seen = drive(coder_down)
    assert [inv.state for inv in seen] == [State.INITIATE_PLAN] + [State.APPEND_CODE] * 3
    assert out.aborted and not out.completed and out.all_failed == 3
    assert out.qualities == [0.9]
    assert out.score == 0.0


def test_a_retry_that_succeeds_lets_the_task_go_on() -> None:
    calls = {"n": 0}

    def flaky_first(inv: Invocation) -> StepResult:
        calls["n"] += 1
        return StepResult(calls["n"] > 1, 1.0, 100)

    out, seen = drive(flaky_first)
    assert seen[0].state is seen[1].state is State.INITIATE_PLAN
    assert out.completed and not out.aborted
    assert out.all_failed == 1
    assert not out.strict_success
    assert out.score == 100.0


def test_code_that_never_runs_iterates_then_ends_unfulfilled() -> None:
    quality = {"planner": 0.9, "coder": 0.0, "debugger": 0.0, "filter": 0.8}
    out, seen = drive(by_role(quality))
    attempt = [State.APPEND_CODE, State.DEBUG, State.FILTER, State.APPEND_CODE, State.UPDATE_PLAN]
    assert [inv.state for inv in seen] == [State.INITIATE_PLAN, *attempt, *attempt]
    assert out.signals == [PlanSignal.ITERATE_ON_LAST_STEP] * 2
    assert not out.completed and not out.aborted
    assert out.all_failed == 0 and out.qualities
    assert out.score == 0.0 and not out.strict_success


def test_successful_task_fulfills_the_instruction() -> None:
    out, seen = drive(by_role({"planner": 0.75, "coder": 1.0, "debugger": 1.0, "filter": 1.0}))
    assert [inv.state for inv in seen] == [
        State.INITIATE_PLAN,
        State.APPEND_CODE,
        State.UPDATE_PLAN,
        State.APPEND_CODE,
        State.UPDATE_PLAN,
    ]
    assert [inv.role for inv in seen] == ["planner", "coder", "planner", "coder", "planner"]
    assert out.signals == [PlanSignal.ADVANCE_TO_NEXT_STEP, PlanSignal.FULFILL_INSTRUCTION]
    assert out.completed and not out.aborted and out.strict_success
    assert out.invocations == 5 and out.all_failed == 0
    assert out.score == pytest.approx(100.0 * (3 * 0.75 + 2 * 1.0) / 5)


def test_iterating_a_step_then_advancing() -> None:
    coder_calls = {"n": 0}

    def learns(inv: Invocation) -> StepResult:
        if inv.role in ("coder", "debugger"):
            coder_calls["n"] += inv.role == "coder"
            return StepResult(True, 0.0 if coder_calls["n"] <= 2 else 1.0, 50)
        return StepResult(True, 0.5, 50)

    out, _ = drive(learns)
    assert out.signals == [
        PlanSignal.ITERATE_ON_LAST_STEP,
        PlanSignal.ADVANCE_TO_NEXT_STEP,
        PlanSignal.FULFILL_INSTRUCTION,
    ]
    assert out.completed


def test_request_bytes_grow_with_context_up_to_the_cap() -> None:
    _, seen = drive(by_role({"planner": 1.0, "coder": 1.0, "debugger": 1.0, "filter": 1.0}))
    # 200 output tokens × 4 bytes join the context after every answer; capped at 3000.
    assert [inv.request_bytes for inv in seen] == [1_000, 1_800, 2_600, 3_000, 3_000]


def test_unfinished_outcome_scores_zero() -> None:
    assert TaskOutcome(completed=False, qualities=[0.9, 0.8]).score == 0.0
    assert TaskOutcome(completed=True, qualities=[]).score == 0.0
    done = TaskOutcome(completed=True, qualities=[0.5, 1.0])
    assert done.score == 75.0 and done.strict_success
