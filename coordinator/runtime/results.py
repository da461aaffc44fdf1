"""What an invocation returns to the caller: the winner and every member's outcome."""

from __future__ import annotations

from dataclasses import dataclass

from schemas.enums import GroupState, MemberStatus, StopReason, WinnerMode


@dataclass(frozen=True, slots=True)
class MemberSummary:
    member_id: str
    candidate_id: str
    zone: str
    rank: int
    status: MemberStatus
    launched: bool
    latency_s: float | None = None
    reason: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0


@dataclass(frozen=True, slots=True)
class InvocationResult:
    group_id: str
    role: str
    state: GroupState
    winner_id: str | None
    candidate_id: str | None
    zone: str | None
    output: str | None
    quality: float | None  # the winner's judged quality, when its backend judged it
    p_success: float
    stop: StopReason
    latency_s: float
    members: list[MemberSummary]
    backups: int  # members launched by the hedge timer (charged to the budget)
    # The rule that picked the winner: the asked ``winner_mode``, or ``ranked`` when
    # ``best`` found no judged outputs; ``fallback_reason`` says why it is not plain
    # ``winner_mode`` (no evaluator, the judge wait expired), None when it is.
    winner_rule: WinnerMode | None = None
    fallback_reason: str | None = None

    @property
    def tokens(self) -> int:
        return sum(m.tokens_in + m.tokens_out for m in self.members)
