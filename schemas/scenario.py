"""The simulated world: pool, topology, models, evaluator, workload and timed changes.

Every modelling assumption the paper leaves open (quality, latency and token
distributions, T_min, the loss timeout, the workflow's shape) is a field here, so it is
written in the scenario file and never buried in code. The TOML format is documented in
``docs/SCENARIOS.md``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.models import (
    Candidate,
    Identifier,
    NonNegative,
    Probability,
    ZoneLink,
    ZoneName,
    link_key,
)

Positive = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LognormalLatency(_Strict):
    kind: Literal["lognormal"] = "lognormal"
    median_s: Positive
    sigma: NonNegative  # log-space standard deviation; 1.0 already gives a heavy tail


class TraceLatency(_Strict):
    """Resample per-request latencies from an llmperf trace file (JSON list)."""

    kind: Literal["trace"] = "trace"
    file: str = Field(min_length=1)  # relative to the scenario file, or absolute
    scale: Positive = 1.0
    include_errors: bool = False  # count the trace's API errors as internal failures


LatencyModel = Annotated[LognormalLatency | TraceLatency, Field(discriminator="kind")]


class QualityModel(_Strict):
    """True quality of one output ~ Beta(mean·c, (1−mean)·c)."""

    mean: Annotated[float, Field(gt=0.0, lt=1.0)]
    concentration: Positive


class TokenModel(_Strict):
    """Output tokens ~ lognormal(median, sigma), at least 1."""

    median: Positive
    sigma: NonNegative = 0.0


class ModelSpec(_Strict):
    quality: QualityModel
    latency: LatencyModel
    tokens_out: TokenModel
    # Standard deviation of the judged score when this model is the evaluator: a weaker
    # evaluator judges more noisily (the evaluator-degradation setting).
    judge_noise: NonNegative = 0.1
    judge_latency_s: NonNegative = 0.5


class NetworkSpec(_Strict):
    timeout_s: Positive = 5.0  # T_timeout: what a lost message costs (spec §8 choice)
    t_min_factor: Annotated[float, Field(ge=0.0, le=1.0)] = 0.5  # T_min(μ) = factor · μ
    bytes_per_token: Positive = 4.0
    # Which legs of a member call may be lost. "request": one loss draw per call, the
    # paper's analytic rate 1 − (1−f)(1−ℓ); "both": request and response each draw.
    lossy_legs: Literal["request", "both"] = "request"


class EvaluatorSpec(_Strict):
    model: str
    zone: ZoneName
    tokens_per_output: Annotated[int, Field(ge=0)] = 200


class WorkloadSpec(_Strict):
    """Shape of the DATAWISE-style workflow (spec §10)."""

    tasks: Annotated[int, Field(ge=1, le=100_000)] = 200
    steps_min: Annotated[int, Field(ge=1)] = 2
    steps_max: Annotated[int, Field(ge=1)] = 4
    max_debug_rounds: Annotated[int, Field(ge=0)] = 2
    max_step_iterations: Annotated[int, Field(ge=1)] = 2
    max_invocation_retries: Annotated[int, Field(ge=0)] = 1
    # A generated cell runs with probability quality ** code_difficulty.
    code_difficulty: Positive = 1.0
    prompt_bytes: Annotated[int, Field(ge=1)] = 2000
    context_bytes_cap: Annotated[int, Field(ge=1)] = 40_000
    deadline_s: Positive = 120.0
    # Pause between tasks so background members of one task overlap the next.
    task_gap_s: NonNegative = 0.0


class FixedZoneSpec(_Strict):
    """A fixed-zone baseline: one candidate per role, all in one zone (spec §9)."""

    name: Identifier
    zone: ZoneName
    model: str
    failure_rate: Probability


class CandidateChange(_Strict):
    kind: Literal["candidate"] = "candidate"
    at_task: Annotated[int, Field(ge=0)]
    candidate: Identifier
    failure_rate: Probability | None = None
    model: str | None = None


class LinkChange(_Strict):
    kind: Literal["link"] = "link"
    at_task: Annotated[int, Field(ge=0)]
    a: ZoneName
    b: ZoneName
    latency_ms: NonNegative | None = None
    jitter_ms: NonNegative | None = None
    bandwidth_tokens_per_ms: Positive | None = None
    loss: Probability | None = None


class EvaluatorChange(_Strict):
    kind: Literal["evaluator"] = "evaluator"
    at_task: Annotated[int, Field(ge=0)]
    model: str
    zone: ZoneName | None = None


Change = Annotated[CandidateChange | LinkChange | EvaluatorChange, Field(discriminator="kind")]


class Shock(_Strict):
    """A correlated outage: during tasks ``from_task``..``to_task`` (inclusive) each
    request is hit with ``probability``, and then every candidate in the scope (all of
    ``target`` zone's endpoints, or ``target`` model wherever it runs) fails that request
    together, as the service's failure. 1.0 takes the scope down for the whole stretch."""

    scope: Literal["zone", "model"]
    target: str = Field(min_length=1)  # a zone of ``zones`` or a model of ``[models]``
    from_task: Annotated[int, Field(ge=0)]
    to_task: Annotated[int, Field(ge=0)]
    probability: Probability = 1.0

    @model_validator(mode="after")
    def _stretch(self) -> Shock:
        if self.from_task > self.to_task:
            raise ValueError(
                f"shock on {self.scope} {self.target!r}: from_task={self.from_task} "
                f"exceeds to_task={self.to_task}"
            )
        return self

    def active(self, task: int) -> bool:
        return self.from_task <= task <= self.to_task


class HardnessTier(_Strict):
    """A share of requests whose every successful output has its true quality scaled:
    quality becomes clip(q · solve_scale, 0, 1). 0 makes a request that defeats every
    model; shares · scales averaging 1 keep each model's marginal quality (up to the clip)."""

    name: Identifier | None = None
    share: Probability
    solve_scale: NonNegative


HARDNESS_SHARE_TOLERANCE = 1e-6  # the tiers' shares must sum to 1 within this


class Scenario(_Strict):
    name: Identifier
    description: str = ""
    caller_zone: ZoneName
    zones: list[ZoneName] = Field(min_length=1)
    network: NetworkSpec = NetworkSpec()
    links: list[ZoneLink]
    models: dict[str, ModelSpec]
    evaluator: EvaluatorSpec
    candidates: list[Candidate] = Field(min_length=1)
    fixed_zone: list[FixedZoneSpec] = Field(default_factory=list)
    workload: WorkloadSpec = WorkloadSpec()
    changes: list[Change] = Field(default_factory=list)
    # Correlated failures (none in the paper's settings, which assume independence).
    shocks: list[Shock] = Field(default_factory=list)
    hardness: list[HardnessTier] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        _check_names(self)
        _check_links(self)
        _check_models(self)
        _check_correlation(self)
        if self.workload.steps_min > self.workload.steps_max:
            raise ValueError(
                f"workload.steps_min={self.workload.steps_min} exceeds "
                f"workload.steps_max={self.workload.steps_max}"
            )
        return self

    @property
    def roles(self) -> list[str]:
        return sorted({c.role for c in self.candidates})

    @property
    def first_change_task(self) -> int | None:
        return min((ch.at_task for ch in self.changes), default=None)


def _check_names(s: Scenario) -> None:
    zones = set(s.zones)
    if len(zones) != len(s.zones):
        raise ValueError(f"duplicate zone in zones={s.zones}")
    if s.caller_zone not in zones:
        raise ValueError(f"caller_zone={s.caller_zone!r} is not one of zones={s.zones}")
    seen: set[str] = set()
    for c in s.candidates:
        if c.id in seen:
            raise ValueError(f"duplicate candidate id {c.id!r}")
        seen.add(c.id)
        if c.zone not in zones:
            raise ValueError(f"candidate {c.id!r} has unknown zone {c.zone!r}; zones={s.zones}")
    for fz in s.fixed_zone:
        if fz.zone not in zones:
            raise ValueError(f"fixed_zone {fz.name!r} has unknown zone {fz.zone!r}")
    _check_changes(s, zones, seen)


def _check_changes(s: Scenario, zones: set[str], ids: set[str]) -> None:
    for ch in s.changes:
        if isinstance(ch, CandidateChange) and ch.candidate not in ids:
            raise ValueError(
                f"change at task {ch.at_task} names unknown candidate {ch.candidate!r}"
            )
        named: list[str] = [ch.a, ch.b] if isinstance(ch, LinkChange) else []
        if isinstance(ch, EvaluatorChange) and ch.zone:
            named.append(ch.zone)
        for z in named:
            if z not in zones:
                raise ValueError(f"change at task {ch.at_task} names unknown zone {z!r}")
        if isinstance(ch, LinkChange) and link_key(ch.a, ch.b) not in {k.key for k in s.links}:
            raise ValueError(
                f"change at task {ch.at_task} names link {ch.a}-{ch.b}, not in [[links]]"
            )


def _check_links(s: Scenario) -> None:
    zones = set(s.zones)
    keys: set[tuple[str, str]] = set()
    for link in s.links:
        for z in (link.a, link.b):
            if z not in zones:
                raise ValueError(
                    f"link {link.a}-{link.b} names unknown zone {z!r}; zones={s.zones}"
                )
        if link.key in keys:
            raise ValueError(f"duplicate link {link.a}-{link.b}")
        keys.add(link.key)
    users = [(f"candidate {c.id!r}", c.zone) for c in s.candidates]
    users += [(f"fixed_zone {f.name!r}", f.zone) for f in s.fixed_zone]
    for who, zone in users:
        if link_key(s.caller_zone, zone) not in keys:
            raise ValueError(
                f"no link between caller zone {s.caller_zone!r} and {zone!r} (needed by {who})"
            )


def _check_models(s: Scenario) -> None:
    used = [(f"candidate {c.id!r}", c.model) for c in s.candidates]
    used.append(("evaluator", s.evaluator.model))
    used += [(f"fixed_zone {f.name!r}", f.model) for f in s.fixed_zone]
    used += [
        (f"change at task {ch.at_task}", ch.model)
        for ch in s.changes
        if isinstance(ch, CandidateChange | EvaluatorChange) and ch.model is not None
    ]
    for where, model in used:
        if model not in s.models:
            raise ValueError(f"{where} uses model {model!r}, not defined in [models]")


def _check_correlation(s: Scenario) -> None:
    for i, shock in enumerate(s.shocks):
        known = s.zones if shock.scope == "zone" else sorted(s.models)
        if shock.target not in known:
            raise ValueError(
                f"shocks[{i}] targets unknown {shock.scope} {shock.target!r}; "
                f"expected one of {known}"
            )
    if s.hardness:
        total = sum(t.share for t in s.hardness)
        if abs(total - 1.0) > HARDNESS_SHARE_TOLERANCE:
            shares = [t.share for t in s.hardness]
            raise ValueError(f"hardness shares {shares} sum to {total:g}; expected 1")
