"""A member's report (its trace and output) as its worker sends it, from the backend's
result and the member's start and finish (workers.member)."""

from __future__ import annotations

from schemas.enums import FailureKind, MemberStatus
from schemas.models import MemberReport, MemberTask, MemberTrace
from workers.backends.base import BackendResult


def not_started(task: MemberTask, kind: FailureKind, reason: str, now: float) -> MemberReport:
    """The report of a member that never ran (``kind``, ``reason``): cancelled, nothing
    delivered, started and finished ``now``."""
    return member_report(
        task, BackendResult(kind, reason, delivered=False), now, now, MemberStatus.CANCELLED
    )


def status_of(result: BackendResult) -> MemberStatus:
    """The member's status from its backend's result: a cancel, or an idempotency key
    another member holds, reads as cancelled, a deadline as timed out, any other failure
    as failed."""
    if result.failure is None:
        return MemberStatus.SUCCEEDED
    if result.failure in (FailureKind.CANCELLED, FailureKind.IDEMPOTENCY_TAKEN):
        return MemberStatus.CANCELLED
    if result.failure is FailureKind.DEADLINE:
        return MemberStatus.TIMED_OUT
    return MemberStatus.FAILED


def member_report(
    task: MemberTask, res: BackendResult, started: float, finished: float, status: MemberStatus
) -> MemberReport:
    """The report of ``task``'s run: its trace (latency from the task's enqueue), and its
    output only when it succeeded."""
    c = task.candidate
    trace = MemberTrace(
        invocation_id=task.group_id,
        group_id=task.group_id,
        member_id=task.member_id,
        candidate_id=c.id,
        role=c.role,
        model=c.model,
        zone=c.zone,
        caller_zone=task.caller_zone,
        rank=task.rank,
        u_plus=task.u_plus,
        r_minus=task.r_minus,
        started_at_s=started,
        finished_at_s=finished,
        status=status,
        failure_kind=res.failure,
        failure_reason=res.reason,
        success=status is MemberStatus.SUCCEEDED,
        quality=res.quality,
        latency_s=max(0.0, finished - task.enqueued_at_s),
        proc_latency_s=res.proc_latency_s,
        tokens_in=res.tokens_in,
        tokens_out=res.tokens_out,
        bytes_sent=res.bytes_sent,
        rtt_s=res.rtt_s,
        bandwidth_Bps=res.bandwidth_Bps,
        lost=res.lost,
    )
    return MemberReport(
        trace=trace, output=res.output if status is MemberStatus.SUCCEEDED else None
    )
