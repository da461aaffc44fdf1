"""`haco plan`: the operator's "why these candidates?" tool.

Input (JSON)::

    {"tau": 0.9, "params": {...optional PolicyParams overrides...},
     "exclude": ["optional ids to leave out, to ask what-if"],
     "candidates": [{"id": "...", "alpha": 3.0, "beta": 1.0, "f_int": 0.02,
                     "loss": 0.015, "t_proc_s": 0.8, "bytes": 4000,
                     "bandwidth_Bps": 200000, "jitter_Bps": 20000}, ...],
     "domains": [{"name": "zone:eu", "members": ["a", "b"], "shock": 0.05}, ...]}

``domains`` (optional): shared failure causes, as ``haco profiles`` shows them from
co-failure evidence; with them P_succ is the dependence-aware figure
(coordinator.core.joint) and the output also gives the paper's independent figure.

Output: the members in rank order, the conservative P_succ, why selection stopped,
and every candidate's μ, σ, ρ, T, C, D, U⁺, R⁻ and cumulative P_succ in rank order.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from coordinator.core.cofailure import Dependence, Domain
from coordinator.core.params import PolicyParams
from coordinator.core.policy import CandidateArrays, allocate
from coordinator.errors import PlanInputError, describe_validation_error
from schemas.models import FailureDomain, HedgeDecision, RankedCandidate

NonNeg = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
Pos = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
Rate = Annotated[float, Field(ge=0.0, le=1.0)]


class PlanCandidate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    alpha: Pos = 1.0
    beta: Pos = 1.0
    f_int: Rate = 0.0
    loss: Rate = 0.0
    t_proc_s: NonNeg = 1.0
    bytes: NonNeg = 0.0
    # A link with no bandwidth figure costs no transfer time (bandwidth = inf).
    bandwidth_Bps: Annotated[float, Field(gt=0.0)] = float("inf")
    jitter_Bps: NonNeg = 0.0


class PlanRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tau: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.9
    params: dict[str, Any] = Field(default_factory=dict)
    exclude: list[str] = Field(default_factory=list)
    candidates: list[PlanCandidate] = Field(min_length=1)
    domains: list[FailureDomain] = Field(default_factory=list)

    @model_validator(mode="after")
    def _ids(self) -> PlanRequest:
        seen: set[str] = set()
        for c in self.candidates:
            if c.id in seen:
                raise PlanInputError(f"duplicate candidate id {c.id!r}; expected unique ids")
            seen.add(c.id)
        for d in self.domains:
            unknown = [m for m in d.members if m not in seen]
            if unknown:
                raise PlanInputError(
                    f"domain {d.name!r} names unknown candidate ids {unknown}; "
                    f"expected ids of the candidates"
                )
        for cid in self.exclude:
            if cid not in seen:
                raise PlanInputError(
                    f"exclude names unknown candidate id {cid!r}; expected one of {sorted(seen)}"
                )
        return self


def parse_request(text: str, source: str = "input") -> PlanRequest:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanInputError(f"{source}: not valid JSON: {exc}") from exc
    try:
        return PlanRequest.model_validate(data)
    except ValidationError as exc:
        raise PlanInputError(describe_validation_error(exc, source)) from exc


def plan(req: PlanRequest) -> HedgeDecision:
    """Run the allocation rule on the request's candidates and explain the result."""
    if "tau" in req.params:
        raise PlanInputError("params.tau: give tau at the top level, not inside params")
    try:
        params = PolicyParams.model_validate({**req.params, "tau": req.tau})
    except ValidationError as exc:
        raise PlanInputError(describe_validation_error(exc, "params")) from exc
    pool = [c for c in req.candidates if c.id not in set(req.exclude)]
    if not pool:
        raise PlanInputError("every candidate is excluded; expected at least one to plan with")
    stats = CandidateArrays.from_columns(
        **{f: [getattr(c, f) for c in pool] for f in PlanCandidate.model_fields if f != "id"}
    )
    index = {c.id: i for i, c in enumerate(pool)}
    dep = Dependence(
        tuple(
            Domain(d.name, tuple(index[m] for m in d.members if m in index), d.shock)
            for d in req.domains
        )
    )
    alloc = allocate(stats, params, dep)
    ranking = [
        RankedCandidate(
            id=pool[i].id,
            mu=float(alloc.mu[i]),
            sigma=float(alloc.sigma[i]),
            rho=float(alloc.rho[i]),
            T_s=float(alloc.T_s[i]),
            C=float(alloc.C[i]),
            D=float(alloc.D[i]),
            u_plus=float(alloc.u_plus[i]),
            r_minus=float(alloc.r_minus[i]),
            p_success_cum=float(alloc.p_success_cum[pos]),
        )
        for pos, i in enumerate(alloc.order)
    ]
    return HedgeDecision(
        members=[pool[i].id for i in alloc.members],
        p_success=alloc.p_success,
        stop=alloc.stop,
        ranking=ranking,
        p_success_indep=alloc.p_success_indep,
        achievable=alloc.achievable,
        domains=[
            FailureDomain(name=d.name, members=[pool[i].id for i in d.members], shock=d.shock)
            for d in (alloc.dependence.domains if alloc.dependence else ())
            if d.members
        ],
        diversified=alloc.diversified,
    )
