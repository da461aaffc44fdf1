"""What one executed member tells about its candidate and its link: :func:`observations`.

It is the one reading of an outcome every profile writer uses: the worker's online fold
(``workers.member``), the coordinator's record of a lost member (``coordinator.runtime.
liveness``: never started = ``NETWORK`` with ``lost``, a transport loss on the link; no
report by the deadline = ``TIMEOUT``, a service failure), the simulator (``sim.engine``),
the tests, and — in SQL, built from
the constants below and checked against this function over every failure kind and
delivery flag (tests/test_recompute.py) — the trace store's recompute
(``coordinator.tracestore.profilesql``) and the ``link_observations`` view (migration 0006).

The rule:

- A member stopped before it could say anything about its candidate (its group was
  cancelled or gone: :data:`NOT_OBSERVED`) is no observation, of the candidate or the link.
- A member whose call succeeded but whose side effect was not committed, because another
  member held the idempotency key (:data:`CALL_SUCCEEDED`), is a success.
- ``delivered`` is not traced: a network failure (:data:`LOST_UNLESS_MEASURED`) without a
  measured request path delay (``rtt_s``) counts as undelivered, anything else as
  delivered.
- Quality and processing latency count only for a success.
- The link: the transmissions the caller measured (``legs``, request and response, when
  the worker or the simulator has them), else — no legs given, or none measured — the
  one the trace records: bytes sent, lost, transfer time bytes / bandwidth, path delay,
  when it records any (:func:`records_link`). The trace store keeps that one row per
  member.
- Loss: a link's loss rate is losses among the transmissions that *can be lost*
  (``LinkObservation.can_be_lost``). A call is one exchange that is lost or not: the
  trace's row is one such trial, so is a real backend's measured leg (workers.probe),
  and of the simulator's legs the request is, the response only when the scenario makes
  responses lossy too (``lossy_legs = "both"``). So for the same members the online
  fold and a recompute count the same trials and losses — with ``lossy_legs = "both"``
  excepted, where the simulated legs are two trials and the trace row one. Bandwidth and
  RTT come from every delivered leg, so their counts per call still differ between
  the online profiles and a recompute (see ``coordinator.tracestore.recompute``).
"""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.core.profiles import CandidateObservation, LinkObservation
from schemas.enums import FailureKind
from schemas.models import MemberTrace

NOT_OBSERVED: frozenset[FailureKind] = frozenset({FailureKind.CANCELLED})
"""Failure kinds of members that are no observation at all."""

CALL_SUCCEEDED: frozenset[FailureKind] = frozenset({FailureKind.IDEMPOTENCY_TAKEN})
"""Failure kinds of members whose call succeeded (a success for the candidate)."""

LOST_UNLESS_MEASURED = FailureKind.NETWORK
"""The failure kind that means "not delivered" unless a request path delay was measured."""

SERVICE_FAILURES: frozenset[FailureKind] = frozenset(
    {
        FailureKind.INTERNAL,
        FailureKind.RATE_LIMITED,
        FailureKind.SERVER_ERROR,
        FailureKind.TIMEOUT,  # a hang or a stall counts against the candidate
        FailureKind.INVALID_RESPONSE,
        FailureKind.CONTENT_FILTERED,
    }
)
"""Failure kinds that are the service's own failures (spec §2: they count towards f_int).
The candidate observation reads each as :attr:`FailureKind.INTERNAL`; the trace keeps
the finer kind."""


def succeeded(failure: FailureKind | None) -> bool:
    """Whether a member with this failure kind counts as a successful call."""
    return failure is None or failure in CALL_SUCCEEDED


def profiled_failure(failure: FailureKind | None) -> FailureKind | None:
    """The kind a failure is counted as in a candidate profile: a service failure as
    INTERNAL (f_int), any other as itself."""
    return FailureKind.INTERNAL if failure in SERVICE_FAILURES else failure


def records_link(trace: MemberTrace) -> bool:
    """Whether the trace records a transmission (a row of the ``link_observations`` view)."""
    return trace.bytes_sent > 0 or trace.lost or trace.rtt_s is not None


def _traced_link(trace: MemberTrace) -> list[LinkObservation]:
    if not records_link(trace):
        return []
    bw = trace.bandwidth_Bps
    transfer = trace.bytes_sent / bw if bw is not None and bw > 0 else None
    return [
        LinkObservation(
            trace.finished_at_s, float(trace.bytes_sent), trace.lost, transfer, trace.rtt_s
        )
    ]


def observations(
    trace: MemberTrace, legs: Sequence[LinkObservation] | None = None
) -> tuple[CandidateObservation | None, list[LinkObservation]]:
    """The candidate observation (None: not an observation) and the link observations of
    one member's trace. ``legs``: the transmissions the caller measured, when known
    (they replace the one the trace records); None or empty reads the trace alone, so a
    call whose backend measured nothing (a real call that failed or was lost, a call
    without an RTT probe) still counts once towards its link's loss rate, as in a
    recompute."""
    failure = trace.failure_kind
    if failure in NOT_OBSERVED:
        return None, []
    ok = succeeded(failure)
    cand = CandidateObservation(
        at_s=trace.finished_at_s,
        delivered=failure is not LOST_UNLESS_MEASURED or trace.rtt_s is not None,
        failure=None if ok else profiled_failure(failure),
        quality=trace.quality if ok else None,
        proc_latency_s=trace.proc_latency_s if ok else None,
        tokens_in=trace.tokens_in,
        tokens_out=trace.tokens_out,
    )
    return cand, list(legs) if legs else _traced_link(trace)
