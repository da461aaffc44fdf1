"""Pydantic models for the wire format: candidates, links, invocations, decisions, traces,
verdicts."""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from schemas.backends import ENDPOINT_SETTINGS
from schemas.enums import (
    FailureKind,
    GroupSignal,
    GroupState,
    LaunchMode,
    MemberStatus,
    StopReason,
    WinnerMode,
)

ZoneName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,62}$")]
Identifier = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")]
Probability = Annotated[float, Field(ge=0.0, le=1.0)]
NonNegative = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BackendSpec(_Strict):
    """How a worker reaches the model behind a candidate: ``sim`` (the simulator),
    ``openai`` (any OpenAI-compatible server) or ``azure`` (Azure OpenAI), whose settings
    are checked against :data:`schemas.backends.ENDPOINT_SETTINGS`; ``http`` is a
    placeholder no worker serves (tests)."""

    kind: Annotated[str, Field(pattern=r"^(sim|http|openai|azure)$")] = "sim"
    settings: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _typed_settings(self) -> BackendSpec:
        model = ENDPOINT_SETTINGS.get(self.kind)
        if model is not None:
            model.model_validate(self.settings)  # a ValidationError names the bad field
        return self


class Candidate(_Strict):
    """One concrete agent instance: role × model × zone (and its endpoint)."""

    id: Identifier
    role: Identifier
    model: str = Field(min_length=1)
    zone: ZoneName
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 0.0
    failure_rate: Probability = 0.0
    # Real mode (spec §13): the share of calls that fail before any request is sent, an
    # operator-injected outage, logged as an agent (internal) failure. 0 = none.
    real_failure_rate: Probability = 0.0
    backend: BackendSpec = Field(default_factory=BackendSpec)


class ZoneLink(_Strict):
    """A logical link between two zones in simulator units (paper Table 5)."""

    a: ZoneName
    b: ZoneName
    latency_ms: NonNegative
    jitter_ms: NonNegative
    bandwidth_tokens_per_ms: Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
    loss: Probability

    @property
    def key(self) -> tuple[str, str]:
        return link_key(self.a, self.b)


def link_key(a: str, b: str) -> tuple[str, str]:
    """Links are symmetric: one key for both directions."""
    return (a, b) if a <= b else (b, a)


class Message(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    role: str = Field(min_length=1)
    content: str


class RoleInvocation(_Strict):
    """e_t = (r_t, x_t) plus the caller's per-call settings."""

    role: Identifier
    payload: list[Message]
    tau: Annotated[float, Field(gt=0.0, lt=1.0)] | None = None
    deadline_s: Annotated[float, Field(gt=0.0, allow_inf_nan=False)] | None = None
    launch_mode: LaunchMode | None = None
    winner_mode: WinnerMode | None = None
    idempotent: bool = True
    idempotency_key: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    # The caller insists on more than one member: a non-idempotent call is then rejected
    # instead of being narrowed to a single candidate.
    require_hedge: bool = False


class RankedCandidate(_Strict):
    """One row of a decision's explanation, in U⁺ order."""

    id: str
    mu: float
    sigma: float
    rho: float
    T_s: float
    C: float
    D: float
    u_plus: float
    r_minus: float
    p_success_cum: float


class FailureDomain(_Strict):
    """A shared failure cause of a pool: when it strikes (probability ``shock`` per
    request) every member in it fails together (coordinator.core.cofailure)."""

    name: str = Field(min_length=1)
    members: list[str] = Field(min_length=1)
    shock: Annotated[float, Field(ge=0.0, lt=1.0)]


class HedgeDecision(_Strict):
    members: list[str]
    p_success: Probability  # dependence-aware when domains are given
    stop: StopReason
    ranking: list[RankedCandidate] = Field(default_factory=list)
    # The dependence-aware rule's terms: the paper's independent figure for the same
    # members, the whole pool's achievable P_succ, the domains used, and whether the
    # members were spread across domains instead of taken as the U⁺ prefix.
    p_success_indep: Probability | None = None
    achievable: Probability | None = None
    domains: list[FailureDomain] = Field(default_factory=list)
    diversified: bool = False


class MemberTrace(_Strict):
    """Everything harvested from one executed member (spec §5)."""

    invocation_id: str
    member_id: str
    candidate_id: str
    role: str
    model: str
    zone: ZoneName
    caller_zone: ZoneName
    rank: Annotated[int, Field(ge=0)]
    u_plus: float
    r_minus: float
    group_id: str = ""
    started_at_s: NonNegative
    finished_at_s: NonNegative
    status: MemberStatus
    failure_kind: FailureKind | None = None
    failure_reason: str | None = None
    success: bool
    quality: Probability | None = None
    latency_s: NonNegative
    proc_latency_s: NonNegative | None = None
    tokens_in: Annotated[int, Field(ge=0)] = 0
    tokens_out: Annotated[int, Field(ge=0)] = 0
    bytes_sent: Annotated[int, Field(ge=0)] = 0
    rtt_s: NonNegative | None = None
    bandwidth_Bps: NonNegative | None = None
    lost: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> MemberTrace:
        if self.finished_at_s < self.started_at_s:
            raise ValueError(
                f"finished_at_s={self.finished_at_s} is before started_at_s={self.started_at_s}"
            )
        if self.success != (self.status is MemberStatus.SUCCEEDED):
            raise ValueError(f"success={self.success} contradicts status={self.status.value}")
        if self.status is not MemberStatus.SUCCEEDED and self.failure_kind is None:
            raise ValueError(f"status={self.status.value} needs a failure_kind")
        return self

    @field_validator("u_plus", "r_minus")
    @classmethod
    def _finite(cls, v: float) -> float:
        if math.isnan(v):
            raise ValueError("must be a number, got NaN")
        return v


class MemberTask(_Strict):
    """The payload of one member task on a zone queue."""

    # Its JSON is the member message's argument (coordinator.runtime.dispatch): a
    # non-finite float there is written as kombu's encoder writes it (Infinity, NaN),
    # which Celery's decoder reads back, not as null.
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")

    group_id: str = Field(min_length=1, max_length=64)
    member_id: str = Field(min_length=1, max_length=96)
    rank: Annotated[int, Field(ge=0)]
    candidate: Candidate
    caller_zone: ZoneName
    payload: list[Message]
    deadline_at_s: NonNegative  # epoch seconds; a member does not start after it
    enqueued_at_s: NonNegative
    u_plus: float = 0.0
    r_minus: float = 0.0
    idempotency_key: str | None = None
    sim_seed: int | None = None  # simulated backends only: fixes the draw (tests, demo)
    # A relayed stream: the Redis stream (coordinator.state.keys.member_chunks) the member
    # appends its content deltas to as they arrive, then an end entry.
    stream_to: str | None = Field(default=None, max_length=160)
    # The close of its group should this member win with the group's first report (a
    # staged close, coordinator.state.closing; None: its coordinator closes the group).
    close: StagedClose | None = None

    @model_validator(mode="after")
    def _own_close(self) -> MemberTask:
        if self.close is not None and self.close.verdict.winner_member != self.member_id:
            raise ValueError(
                f"close.verdict.winner_member={self.close.verdict.winner_member!r}; "
                f"expected this member, {self.member_id!r}"
            )
        return self


class MemberReport(_Strict):
    """What a member sends back on its group's reply list and appends to the trace stream."""

    trace: MemberTrace
    output: str | None = None


Count = Annotated[int, Field(ge=0)]


class GroupVerdict(_Strict):
    """A hedge group's outcome as its coordinator decided it, appended to the trace stream
    when the group closes and harvested into ``invocations`` (one row per group).

    Member counts are the coordinator's view at the verdict: ``planned`` members chosen,
    ``launched`` of them started, and every launched one in exactly one of
    ``succeeded``, ``failed``, ``timed_out``, ``cancelled`` (its report said so, or the
    close cancelled it) or ``running`` (kept running for harvesting)."""

    group_id: str = Field(min_length=1, max_length=64)
    role: str = Field(min_length=1)
    state: GroupState
    winner_member: str | None = None
    p_success: Probability  # the conservative success probability of the chosen set
    stop: StopReason
    launch_mode: LaunchMode
    winner_mode: WinnerMode
    started_at_s: NonNegative  # epoch seconds: the group was planned
    decided_at_s: NonNegative  # epoch seconds: the verdict
    latency_s: NonNegative  # what the caller waited (staged close: until the winner's report)
    planned: Count
    launched: Count
    succeeded: Count = 0
    failed: Count = 0
    timed_out: Count = 0
    cancelled: Count = 0
    running: Count = 0
    backups: Count = 0  # members launched by the hedge timer (charged to the budget)
    # The rule that picked the winner (``winner_mode``, or ``ranked`` when ``best`` had no
    # judged outputs) and why it differs from plain ``winner_mode`` (None: it does not).
    winner_rule: WinnerMode | None = None
    fallback_reason: str | None = Field(default=None, max_length=500)

    @model_validator(mode="after")
    def _consistent(self) -> GroupVerdict:
        if not self.state.final:
            raise ValueError(f"state={self.state.value} is not a verdict")
        if (self.winner_member is not None) != (self.state is GroupState.WON):
            raise ValueError(
                f"winner_member={self.winner_member!r} contradicts state={self.state.value}"
            )
        ended = self.succeeded + self.failed + self.timed_out + self.cancelled + self.running
        if ended != self.launched or self.launched > self.planned:
            raise ValueError(
                f"member counts: {ended} by status, launched={self.launched}, "
                f"planned={self.planned}; expected by status = launched <= planned"
            )
        if self.backups > self.launched:
            raise ValueError(f"backups={self.backups} exceeds launched={self.launched}")
        if self.decided_at_s < self.started_at_s:
            raise ValueError(
                f"decided_at_s={self.decided_at_s} is before started_at_s={self.started_at_s}"
            )
        return self


class StagedClose(_Strict):
    """A member's group closed by that member's report, should it be the group's first
    report and a success (coordinator.state.closing): the members' signal, the operator
    counters and the verdict (``won``, this member the winner), as its coordinator would
    close the group then. The worker fills in ``decided_at_s`` and ``latency_s`` at the
    report; the rest is fixed when the member is launched."""

    signal: GroupSignal
    counts: dict[str, Count]
    verdict: GroupVerdict

    @model_validator(mode="after")
    def _a_win(self) -> StagedClose:
        if self.signal is GroupSignal.OPEN:
            raise ValueError("signal=open; expected resolved or cancelled: a close ends the group")
        if self.verdict.state is not GroupState.WON:
            raise ValueError(f"verdict.state={self.verdict.state.value}; expected won")
        return self


MemberTask.model_rebuild()
