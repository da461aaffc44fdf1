"""Run one method over one scenario and measure it (spec §11)."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from coordinator.core.methods import (
    BASELINES,
    HACO_METHODS,
    FirstCandidate,
    Method,
    haco_variant,
)
from coordinator.core.params import PolicyParams, ProfileSettings
from coordinator.errors import InputError
from schemas.models import Candidate
from schemas.scenario import Scenario
from sim.engine import InvocationRecord, SimOptions, Simulation
from sim.workflow import ROLE_OF, TaskOutcome, datawise_task
from sim.world import SimWorld


def check_workflow_roles(scenario: Scenario) -> None:
    """The DATAWISE workflow invokes four roles; a pool missing one cannot run it."""
    missing = sorted(set(ROLE_OF.values()) - set(scenario.roles))
    if missing:
        raise InputError(
            f"scenario {scenario.name!r} has no candidate for roles {missing}; the workflow "
            f"needs {sorted(set(ROLE_OF.values()))}"
        )


def method_names(scenario: Scenario) -> list[str]:
    fixed = [f"fixed-{f.name}" for f in scenario.fixed_zone]
    return [*BASELINES, *fixed, *HACO_METHODS]


def build_method(name: str, scenario: Scenario, params: PolicyParams) -> Method:
    if name in BASELINES:
        return BASELINES[name]()
    if name.startswith("fixed-") and any(f"fixed-{f.name}" == name for f in scenario.fixed_zone):
        return FirstCandidate(name=name)
    if name in HACO_METHODS:
        return haco_variant(params, name.removeprefix("haco-"))
    raise InputError(
        f"unknown method {name!r}; expected one of {', '.join(method_names(scenario))}"
    )


def pools_for(name: str, scenario: Scenario, world: SimWorld) -> dict[str, list[Candidate]]:
    """The scenario's pool per role, or a one-candidate-per-role fixed-zone pool."""
    if name.startswith("fixed-"):
        spec = next(f for f in scenario.fixed_zone if f"fixed-{f.name}" == name)
        pools: dict[str, list[Candidate]] = {}
        for role in scenario.roles:
            temp = next(c.temperature for c in scenario.candidates if c.role == role)
            cand = Candidate(
                id=f"{name}-{role}",
                role=role,
                model=spec.model,
                zone=spec.zone,
                temperature=temp,
                failure_rate=spec.failure_rate,
            )
            world.register(cand)
            pools[role] = [cand]
        return pools
    pools = {}
    for c in scenario.candidates:
        pools.setdefault(c.role, []).append(c)
    return pools


@dataclass
class RunResult:
    scenario: str
    method: str
    seed: int
    tau: float
    tasks: int
    invocations: int
    all_failed_pct: float
    avg_score: float
    strict_success_pct: float
    tokens_k_per_task: float
    judge_tokens_k_per_task: float
    latency_s_per_task: float
    mean_hedge_size: float
    hedge_sizes: dict[int, int]
    change_task: int | None
    all_failed_pct_before: float
    all_failed_pct_after: float
    zone_member_share_before: dict[str, float]
    zone_member_share_after: dict[str, float]
    zone_inclusion_before: dict[str, float]
    zone_inclusion_after: dict[str, float]
    # Launch modes (sim.engine.SimOptions): how many members actually started, how many
    # were cancelled, and how often the group's answer was qualified.
    launch: str
    mean_launched: float
    mean_cancelled: float
    qualified_pct: float
    winner_qualified_pct: float
    zone_share_by_task: list[dict[str, float]] = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _pct(num: int, den: int) -> float:
    return 100.0 * num / den if den else 0.0


def _zone_shares(recs: list[InvocationRecord], zones: list[str]) -> tuple[dict[str, float], ...]:
    members = Counter(z for r in recs for z in r.zones)
    total = sum(members.values())
    share = {z: _pct(members[z], total) for z in zones}
    incl = {z: _pct(sum(1 for r in recs if z in r.zones), len(recs)) for z in zones}
    return share, incl


def summarize(
    scenario: Scenario,
    method: str,
    seed: int,
    tau: float,
    outcomes: list[TaskOutcome],
    sim: Simulation,
) -> RunResult:
    recs = sim.records
    inv = max(1, len(recs))
    n = len(outcomes)
    cut = scenario.first_change_task
    split = cut if cut is not None else n // 2
    before = [r for r in recs if r.task < split]
    after = [r for r in recs if r.task >= split]
    zones = scenario.zones
    share_b, incl_b = _zone_shares(before, zones)
    share_a, incl_a = _zone_shares(after, zones)
    by_task: list[list[InvocationRecord]] = [[] for _ in range(n)]
    for r in recs:
        by_task[r.task].append(r)
    sizes = Counter(len(r.members) for r in recs)
    task_latency = np.zeros(n)
    for r in recs:
        task_latency[r.task] += r.latency_s
    return RunResult(
        scenario=scenario.name,
        method=method,
        seed=seed,
        tau=tau,
        tasks=n,
        invocations=len(recs),
        all_failed_pct=_pct(sum(r.all_failed for r in recs), len(recs)),
        avg_score=float(np.mean([o.score for o in outcomes])),
        strict_success_pct=_pct(sum(o.strict_success for o in outcomes), n),
        tokens_k_per_task=sum(r.tokens for r in recs) / n / 1000.0,
        judge_tokens_k_per_task=sum(r.judge_tokens for r in recs) / n / 1000.0,
        latency_s_per_task=float(task_latency.mean()),
        mean_hedge_size=float(np.mean([len(r.members) for r in recs])),
        hedge_sizes=dict(sorted(sizes.items())),
        change_task=cut,
        all_failed_pct_before=_pct(sum(r.all_failed for r in before), len(before)),
        all_failed_pct_after=_pct(sum(r.all_failed for r in after), len(after)),
        zone_member_share_before=share_b,
        zone_member_share_after=share_a,
        zone_inclusion_before=incl_b,
        zone_inclusion_after=incl_a,
        launch=sim.options.label,
        mean_launched=sum(r.launched for r in recs) / inv,
        mean_cancelled=sum(r.cancelled for r in recs) / inv,
        qualified_pct=_pct(sum(r.qualified for r in recs), len(recs)),
        winner_qualified_pct=_pct(sum(r.winner_qualified for r in recs), len(recs)),
        zone_share_by_task=[_zone_shares(t, zones)[0] for t in by_task],
    )


def run(
    scenario: Scenario,
    method: str,
    seed: int = 0,
    params: PolicyParams | None = None,
    tasks: int | None = None,
    profile_settings: ProfileSettings | None = None,
    options: SimOptions | None = None,
) -> RunResult:
    """Drive ``tasks`` DATAWISE tasks through ``method`` on a fresh world (:func:`simulate`
    without the per-invocation records)."""
    return simulate(scenario, method, seed, params, tasks, profile_settings, options)[0]


def simulate(
    scenario: Scenario,
    method: str,
    seed: int = 0,
    params: PolicyParams | None = None,
    tasks: int | None = None,
    profile_settings: ProfileSettings | None = None,
    options: SimOptions | None = None,
) -> tuple[RunResult, list[InvocationRecord]]:
    """Drive ``tasks`` DATAWISE tasks through ``method`` on a fresh world; the summary and
    every invocation's record. ``options``: the launch mode and cancellation (default:
    the paper's parallel launch, losers kept). Three streams per seed: the simulation's
    [seed, 1] (decisions, calls, judge noise), the workflow's [seed, 2], and the request
    contexts' and verdicts' [seed, 3]."""
    params = params or PolicyParams()
    n_tasks = tasks if tasks is not None else scenario.workload.tasks
    if n_tasks < 1:
        raise InputError(f"tasks={n_tasks}; expected at least 1")
    check_workflow_roles(scenario)
    world = SimWorld(scenario)
    impl = build_method(method, scenario, params)
    pools = pools_for(method, scenario, world)
    sim_rng = np.random.default_rng([seed, 1])
    work_rng = np.random.default_rng([seed, 2])
    ctx_rng = np.random.default_rng([seed, 3])
    sim = Simulation(
        world, pools, impl, sim_rng, profile_settings, ctx_rng=ctx_rng, options=options
    )
    outcomes: list[TaskOutcome] = []
    bpt = scenario.network.bytes_per_token
    for task in range(n_tasks):
        world.apply_changes(task)
        sim.task = task
        sim.now_s += scenario.workload.task_gap_s
        ctl = datawise_task(scenario.workload, work_rng, bpt)
        try:
            inv = next(ctl)
            while True:
                inv = ctl.send(sim.invoke(inv))
        except StopIteration as stop:
            outcomes.append(stop.value)
    sim.finish()
    return summarize(scenario, method, seed, params.tau, outcomes, sim), sim.records
