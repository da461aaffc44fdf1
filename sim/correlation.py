"""How correlated a scenario's failures are, measured from the world alone.

HACO's stopping rule 1 − Π(1 − R⁻) assumes hedge members fail independently. These
functions draw requests through :meth:`SimWorld.begin_request` and :meth:`SimWorld.call`
for every candidate of one role (no method, no profiles: every candidate answers every
request) and report the figures that a fleet's per-question results show, e.g. for a
DATAWISE agent on InfiAgent-DABench: the share of requests at least one candidate
solves, the share that defeats all, and for each pair P(both unsolved) over the product
of the marginals (1 = independent).

A candidate *solves* a request when its call succeeds and its output is qualified:
``u < quality`` with u uniform, quality being the probability of a qualified answer
(``sim.candidates.SimModel.quality``). The u come from the context stream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas.models import Candidate
from schemas.scenario import Scenario
from sim.world import SimWorld

BoolMatrix = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Outcomes:
    """Per request (rows) and candidate (columns): did the call fail, was it solved."""

    candidates: list[Candidate]
    failed: BoolMatrix
    solved: BoolMatrix


def role_candidates(scenario: Scenario, role: str, limit: int | None = None) -> list[Candidate]:
    cands = [c for c in scenario.candidates if c.role == role]
    if not cands:
        raise ValueError(f"scenario {scenario.name!r} has no candidate in role {role!r}")
    return cands[:limit] if limit is not None else cands


def draw_outcomes(
    scenario: Scenario,
    role: str,
    n_requests: int,
    seed: int = 0,
    limit: int | None = None,
) -> Outcomes:
    """``n_requests`` requests spread evenly over the scenario's tasks (so shocks and
    timed changes apply in proportion), each sent to every candidate of ``role`` (or the
    first ``limit``) with one shared context."""
    if n_requests < 1:
        raise ValueError(f"n_requests={n_requests}; expected at least 1")
    cands = role_candidates(scenario, role, limit)
    world = SimWorld(scenario)
    ctx_rng = np.random.default_rng([seed, 3])
    call_rng = np.random.default_rng([seed, 4])
    n_tasks = scenario.workload.tasks
    request_bytes = float(scenario.workload.prompt_bytes)
    failed = np.zeros((n_requests, len(cands)), dtype=bool)
    solved = np.zeros((n_requests, len(cands)), dtype=bool)
    task = -1
    for r in range(n_requests):
        t = r * n_tasks // n_requests
        while task < t:
            task += 1
            world.apply_changes(task)
        ctx = world.begin_request(ctx_rng)
        for j, cand in enumerate(cands):
            draw = world.call(cand, request_bytes, call_rng, ctx)
            u = ctx_rng.random()  # always drawn, so the order does not depend on outcomes
            failed[r, j] = draw.failure is not None
            solved[r, j] = draw.quality is not None and u < draw.quality
    return Outcomes(cands, failed, solved)


def pair_ratios(bad: BoolMatrix) -> dict[tuple[int, int], float]:
    """For each pair of columns: P(both bad) / (P(i bad) · P(j bad)); 1 = independent.
    Pairs with a column that is never bad are left out (the ratio is undefined)."""
    p = bad.mean(axis=0)
    out: dict[tuple[int, int], float] = {}
    for i, j in combinations(range(bad.shape[1]), 2):
        den = float(p[i] * p[j])
        if den > 0:
            out[(i, j)] = float((bad[:, i] & bad[:, j]).mean()) / den
    return out


def _range(values: list[float]) -> dict[str, float]:
    if not values:
        return {"min": math.nan, "mean": math.nan, "max": math.nan}
    return {"min": min(values), "mean": sum(values) / len(values), "max": max(values)}


def hardness_figures(
    scenario: Scenario, role: str, n_requests: int = 20_000, seed: int = 0, limit: int = 5
) -> dict[str, Any]:
    """The DATAWISE figures among the first ``limit`` candidates of ``role``: share of
    requests solved by at least one, share defeated by all, per-candidate unsolved
    rate, and the pairwise both-unsolved ratio to independence (min/mean/max)."""
    o = draw_outcomes(scenario, role, n_requests, seed, limit)
    unsolved = ~o.solved
    ratios = pair_ratios(unsolved)
    ids = [c.id for c in o.candidates]
    return {
        "candidates": ids,
        "n_requests": n_requests,
        "solvable_share": float(o.solved.any(axis=1).mean()),
        "defeated_share": float(unsolved.all(axis=1).mean()),
        "independent_solvable_share": 1.0 - float(np.prod(unsolved.mean(axis=0))),
        "unsolved_rate": dict(zip(ids, unsolved.mean(axis=0).tolist(), strict=True)),
        "pair_ratio": _range(list(ratios.values())),
        "pair_ratios": {f"{ids[i]}|{ids[j]}": v for (i, j), v in ratios.items()},
    }


def pooled_ratio(bad: BoolMatrix, pairs: list[tuple[int, int]]) -> float:
    """Σ P(both bad) / Σ P(i bad)·P(j bad) over ``pairs``: the ratio of observed to
    independently expected co-failures of a group of pairs. Unlike the mean of the
    pairs' ratios it is not thrown about by pairs that almost never fail."""
    p = bad.mean(axis=0)
    both = sum(float((bad[:, i] & bad[:, j]).mean()) for i, j in pairs)
    expected = sum(float(p[i] * p[j]) for i, j in pairs)
    return both / expected if expected > 0 else math.nan


def _in_scope(scenario: Scenario, a: Candidate, b: Candidate) -> bool:
    """Whether some shock of the scenario takes down both candidates together."""
    for shock in scenario.shocks:
        attr = "zone" if shock.scope == "zone" else "model"
        if getattr(a, attr) == getattr(b, attr) == shock.target:
            return True
    return False


def cofailure_figures(
    scenario: Scenario, role: str, n_requests: int = 20_000, seed: int = 0
) -> dict[str, Any]:
    """Co-failure of calls (network or internal) among all candidates of ``role``:
    the pooled ratio P(both fail) / (P(i) · P(j)) (see :func:`pooled_ratio`) of groups
    of pairs: sharing a zone or not, sharing a model across zones, and taken down
    together by one of the scenario's shocks or not. A zone shock shows as in-scope
    (same-zone) pairs far above 1 with cross-zone pairs near 1; a model shock as its
    model's replicas in different zones far above 1."""
    o = draw_outcomes(scenario, role, n_requests, seed)
    cands = o.candidates
    pairs = list(combinations(range(len(cands)), 2))
    groups: dict[str, list[tuple[int, int]]] = {
        "same_zone": [],
        "cross_zone": [],
        "same_model_cross_zone": [],
        "in_shock_scope": [],
        "out_of_shock_scope": [],
    }
    for i, j in pairs:
        a, b = cands[i], cands[j]
        groups["same_zone" if a.zone == b.zone else "cross_zone"].append((i, j))
        if a.model == b.model and a.zone != b.zone:
            groups["same_model_cross_zone"].append((i, j))
        scoped = _in_scope(scenario, a, b)
        groups["in_shock_scope" if scoped else "out_of_shock_scope"].append((i, j))
    ids = [c.id for c in cands]
    ratios = pair_ratios(o.failed)
    return {
        "candidates": ids,
        "n_requests": n_requests,
        "failure_rate": dict(zip(ids, o.failed.mean(axis=0).tolist(), strict=True)),
        "all_failed_share": float(o.failed.all(axis=1).mean()),
        "pooled_ratio": {name: pooled_ratio(o.failed, ps) for name, ps in groups.items()},
        "pair_ratios": {f"{ids[i]}|{ids[j]}": v for (i, j), v in ratios.items()},
    }
