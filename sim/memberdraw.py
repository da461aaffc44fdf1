"""What a simulated member's call leaves behind (sim/engine.py): the trace a worker would
write for its draw, and the tokens it has cost when it is cancelled part way."""

from __future__ import annotations

from schemas.enums import FailureKind, MemberStatus
from schemas.models import Candidate, MemberTrace
from sim.candidates import CallDraw


def sim_trace(
    cand: Candidate,
    caller_zone: str,
    draw: CallDraw,
    judged: float | None,
    at_s: float,
    late: bool = False,
) -> MemberTrace:
    """The trace a worker would write for a simulated call (workers.backends.simulated
    maps a draw the same way). Validation is skipped: the draw is consistent by
    construction, and the simulator makes many.

    A ``late`` member (finished after the deadline) that would have succeeded is a
    ``TIMEOUT``, what the live runtime records for a member with no report by the
    deadline (coordinator.runtime.liveness): a service failure, with no quality and no
    processing latency of a success. Its link legs are read as measured all the same."""
    req = draw.request
    timed_out = late and draw.failure is None
    failure = FailureKind.TIMEOUT if timed_out else draw.failure
    ok = failure is None
    status = MemberStatus.SUCCEEDED if ok else MemberStatus.FAILED
    delivered = not req.lost
    return MemberTrace.model_construct(
        invocation_id="", member_id="", candidate_id=cand.id, role=cand.role,
        model=cand.model, zone=cand.zone, caller_zone=caller_zone, rank=0, u_plus=0.0,
        r_minus=0.0, group_id="", started_at_s=max(0.0, at_s - draw.total_s),
        finished_at_s=at_s, status=MemberStatus.TIMED_OUT if timed_out else status,
        failure_kind=failure, failure_reason=None, success=ok,
        quality=judged if ok else None, latency_s=draw.total_s,
        proc_latency_s=None if timed_out else draw.proc_latency_s, tokens_in=draw.tokens_in,
        tokens_out=draw.tokens_out, bytes_sent=int(req.bytes),
        rtt_s=req.t_path_s if delivered else None,
        bandwidth_Bps=req.bytes / req.t_tx_s if delivered and req.t_tx_s else None,
        lost=req.lost or (draw.response is not None and draw.response.lost),
    )  # fmt: skip


def clip(x: float) -> float:
    return 0.0 if x < 0.0 else min(x, 1.0)


def cut_tokens(draw: CallDraw, elapsed_s: float) -> int:
    """Tokens a member cancelled ``elapsed_s`` after its launch has cost. Its input
    tokens count once the request has arrived (the request leg's time has passed);
    its output tokens in proportion to the processing done by then (all of them once
    processing is over and the response is on its way; none for a call that fails, which
    produces no output). The rule assumes output streams evenly over processing."""
    arrived_s = draw.request.t_net_s
    if draw.request.lost or elapsed_s < arrived_s:
        return 0
    proc = draw.proc_latency_s
    if not draw.tokens_out or proc is None:
        return draw.tokens_in
    done = 1.0 if proc <= 0.0 else min(1.0, (elapsed_s - arrived_s) / proc)
    return draw.tokens_in + round(draw.tokens_out * done)
