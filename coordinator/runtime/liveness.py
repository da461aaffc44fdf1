"""Liveness of hedge members (issue 8, "a zone that goes dark"): the start signal, who
records a lost member, and the lost member's trace.

- **Started.** A worker that starts a member first claims the member's *start* (``SET
  NX`` through :meth:`RuntimeStore.claim_idempotency`, key :func:`start_key`), then
  pushes :func:`started_token` on the group's reply list, which the coordinator already
  pops. A coordinator that gives up on a member not started in time claims the same key:
  whoever is first decides, so a member declared *not started* never runs later (its
  worker finds the claim taken and reports CANCELLED, no observation), and a member whose
  worker won the claim is known to have started.
- **Outcome.** Whoever records the member's outcome (profiles and the trace stream)
  claims :func:`outcome_key` first: the worker when it finishes, the coordinator when it
  records the member as lost. A lost member that later reports is not counted twice.
- **Lost.** The coordinator records a member as lost (:func:`lost_report`, written like a
  worker's trace: the delta profiles and ``haco:traces`` in one transaction, so the
  Postgres recompute keeps the evidence):

  - never started (start timeout, or no start by the deadline): the zone's queue was not
    consumed, a transport failure — ``FailureKind.NETWORK`` with ``lost = True``: the
    candidate's call was not delivered (f_int unchanged) and the caller→zone link counts
    a loss (ℓ_net), so every candidate of a dark zone loses ρ together;
  - started but no report by the deadline (a hang, or its worker died): the service's
    own failure — ``FailureKind.TIMEOUT`` (delivered, counts towards f_int).

  A member given up by patience is recorded when its deadline passes without its report
  (a timer), or at the close when the close cancels it; a slow member that does finish
  before its deadline reports its real outcome instead.

Keys: ``haco:idem:start:<member>`` and ``haco:idem:outcome:<member>``, TTL group_ttl_s.
"""

from __future__ import annotations

import functools
import heapq
import logging
import math
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from coordinator.config import HacoSettings
from coordinator.core.evidence import link_id
from coordinator.core.observations import observations
from coordinator.core.params import ProfileSettings
from coordinator.core.patience import Budgets, GaveUp, Watch, patience_s, start_timeout_s
from coordinator.core.percentiles import RankedWindow
from coordinator.runtime.group import Group
from coordinator.runtime.ports import RuntimeStore
from coordinator.state.codec import rank_token
from coordinator.state.memberops import OutcomeLimits
from schemas.enums import FailureKind, GroupSignal, MemberStatus
from schemas.models import Candidate, MemberReport, MemberTrace
from schemas.pool import SimSection

STARTED_PREFIX = "started:"
WORKER = "worker"
COORDINATOR = "coordinator"
log = logging.getLogger(__name__)


def started_token(rank: int) -> str:
    """The reply-list entry a worker pushes when it starts the member of ``rank``."""
    return f"{STARTED_PREFIX}{rank}"


def parse_started(raw: str) -> int | None:
    """The rank of a started token, None for anything else (a report, a wake token)."""
    return rank_token(STARTED_PREFIX, raw)


def start_key(member_id: str) -> str:
    return f"start:{member_id}"


def outcome_key(member_id: str) -> str:
    return f"outcome:{member_id}"


def claim(store: RuntimeStore, key: str, who: str, ttl_s: float) -> bool:
    """Whether ``who`` holds the claim ``key`` (SET NX; the first claimant keeps it)."""
    return store.claim_idempotency(key, who, ttl_s) == who


class QueueWaits:
    """Recent queue waits (launch → started) per zone, in this process: the start
    timeout's evidence. Per process on purpose: it costs no round trip, and a coordinator
    learns it from its own groups within a few invocations."""

    def __init__(self, window: int) -> None:
        self._lock = threading.Lock()
        self._waits: dict[str, RankedWindow] = defaultdict(lambda: RankedWindow(window))

    def record(self, zone: str, wait_s: float) -> None:
        if not math.isfinite(wait_s):
            return  # no clock gives one; nothing to rank
        with self._lock:
            self._waits[zone].add(wait_s)

    def start_timeout_s(self, zone: str, s: HacoSettings) -> float:
        """The zone's start timeout (core.patience.start_timeout_s) on its waits so far."""
        with self._lock:
            waits = self._waits.get(zone)
            return start_timeout_s(
                s.start_timeout_min_s, s.start_timeout_factor, () if waits is None else waits,
                s.start_wait_min_samples,
            )  # fmt: skip


def wall_scale(cand: Candidate, pool_sim: SimSection | None, default_scale: float) -> float:
    """Wall-clock seconds per profiled second: a simulated backend lives through its
    simulated latency scaled by its time scale; a real one in real time."""
    if cand.backend.kind != "sim":
        return 1.0
    raw = cand.backend.settings.get("sim")
    own = SimSection.model_validate(raw) if isinstance(raw, dict) else pool_sim
    return (own.time_scale if own is not None else None) or default_scale


def lost_report(
    base: MemberTrace, why: GaveUp | None, started: bool, launched_at: float, now: float
) -> MemberReport:
    """The trace of a member recorded as lost. ``base`` carries the member's identity;
    ``why`` None: no report by the deadline."""
    if started:
        kind = FailureKind.TIMEOUT
        reason = (
            "no report within its patience, nor by the deadline"
            if why is GaveUp.NO_REPORT
            else "started but no report by the deadline"
        )
    else:
        kind = FailureKind.NETWORK
        reason = (
            "not started within the start timeout: its zone's queue is not consumed"
            if why is GaveUp.NOT_STARTED
            else "not started by the deadline: its zone's queue is not consumed"
        )
    trace = base.model_copy(
        update={
            "started_at_s": launched_at,
            "finished_at_s": max(now, launched_at),
            "status": MemberStatus.TIMED_OUT,
            "failure_kind": kind,
            "failure_reason": reason,
            "success": False,
            "latency_s": max(0.0, now - launched_at),
            "lost": not started,
        }
    )
    return MemberReport(trace=MemberTrace.model_validate(trace.model_dump()))


class Deferred:
    """Actions due at a time, run by one daemon thread (started on first use) in due
    order: a group closed before its deadline leaves its unreported members' checks
    here. :meth:`close` drops what is pending (tests, shutdown)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._cv = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self._thread: threading.Thread | None = None
        self._closed = False

    def at(self, when_s: float, action: Callable[[], None]) -> None:
        with self._cv:
            if self._closed:
                return
            self._seq += 1
            heapq.heappush(self._heap, (when_s, self._seq, action))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="haco-lost", daemon=True)
                self._thread.start()
            elif self._heap[0][1] == self._seq:
                # Due before what the thread waits for. Otherwise it is not woken: checks
                # come in due order (each a start timeout or a deadline after its close),
                # and a wake-up per close would cost the caller's thread the GIL.
                self._cv.notify()

    def pending(self) -> int:
        with self._cv:
            return len(self._heap)

    def _next(self) -> Callable[[], None] | None:
        with self._cv:
            while not self._closed:
                if self._heap and self._heap[0][0] <= self.clock():
                    return heapq.heappop(self._heap)[2]
                wait = self._heap[0][0] - self.clock() if self._heap else None
                self._cv.wait(None if wait is None else min(max(wait, 0.0), 1.0))
            return None

    def _run(self) -> None:
        while (action := self._next()) is not None:
            try:
                action()
            except Exception:  # a lost record is evidence, not the caller's result
                with self._cv:
                    overtaken = self._closed
                # One that close() overtook (its client closed under it) is dropped
                # quietly, as the pending ones are.
                if not overtaken:
                    log.exception("a deferred record of a lost member failed")

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._heap.clear()
            self._cv.notify_all()


def watch_for(
    settings: HacoSettings,
    waits: QueueWaits,
    pool_sim: SimSection | None,
    cands: Sequence[Candidate],
    t_proc_s: Sequence[float],
) -> Watch:
    """The give-up clocks of a group's members (``cands`` in rank order, ``t_proc_s`` the
    policy's processing-latency estimate of each, in profiled seconds)."""
    s = settings
    budgets = []
    for cand, t in zip(cands, t_proc_s, strict=True):
        start = waits.start_timeout_s(cand.zone, s)
        wall = float(t) * wall_scale(cand, pool_sim, s.sim_time_scale)
        budgets.append(Budgets(start, patience_s(s.patience_min_s, s.patience_factor, wall)))
    return Watch(budgets)


@dataclass(frozen=True, slots=True)
class Lost:
    """One member to record as lost, with what is known of it at the close."""

    member_id: str
    group_id: str
    launched_at: float
    started: bool
    why: GaveUp | None
    start_by: float  # launched_at + its start timeout
    deadline_at: float
    # The member's identity as a trace, built when it is recorded: most members a close
    # leaves unreported are losers kept running, which report their own outcome.
    trace_base: Callable[[], MemberTrace] = field(compare=False, repr=False)


def _trace_base(g: Group, rank: int, caller_zone: str) -> MemberTrace:
    c, d, at = g.candidates[rank], g.decision, g.launched_at[rank] or g.t0
    return MemberTrace(
        invocation_id=g.id, group_id=g.id, member_id=g.member_id(rank), candidate_id=c.id,
        role=c.role, model=c.model, zone=c.zone, caller_zone=caller_zone, rank=rank,
        u_plus=d.u_plus[rank] if d.u_plus else 0.0,
        r_minus=d.r_minus[rank] if d.r_minus else 0.0, started_at_s=at, finished_at_s=at,
        status=MemberStatus.TIMED_OUT, failure_kind=FailureKind.TIMEOUT, success=False,
        latency_s=0.0,
    )  # fmt: skip


def unreported(g: Group, caller_zone: str) -> list[Lost]:
    """The group's launched members without a report, as the close knows them."""
    w, out = g.watch, []
    for r, at in enumerate(g.launched_at):
        if at is not None and g.reports[r] is None:
            why = w.given_up.get(r, (None,))[0]
            base = functools.partial(_trace_base, g, r, caller_zone)
            start_by = at + w.budgets[r].start_s
            out.append(
                Lost(g.member_id(r), g.id, at, w.started(r), why, start_by, g.deadline_at, base)
            )
    return out


def _decided(m: Lost, past_deadline: bool, cancel: bool) -> bool:
    """Whether the close can record ``m`` as lost now: past its deadline; or never
    started and given up (it never will: the coordinator holds its start); or given up
    for silence and cancelled by the close (it will not report a real outcome)."""
    if past_deadline or m.why is GaveUp.NOT_STARTED:
        return True
    return cancel and m.why is GaveUp.NO_REPORT


class LostRecorder:
    """Records lost members (module doc): at the close what is decided there, at the
    deadline (:class:`Deferred`) the members a close before it left unreported."""

    def __init__(
        self,
        store: RuntimeStore,
        settings: HacoSettings,
        profile_settings: ProfileSettings,
        clock: Callable[[], float],
    ) -> None:
        self.store = store
        self.settings = settings
        self.profile_settings = profile_settings
        self.clock = clock
        self.deferred = Deferred(clock)

    def on_close(self, lost: Sequence[Lost], now: float, cancel: bool) -> None:
        """``lost``: the launched members without a report at the close. A member kept
        running is checked later: at its start timeout while it has not started (it is
        then declared not started even though its group no longer needs it: evidence
        about its zone keeps coming while the zone ranks low), at its deadline once it
        has."""
        for m in lost:
            if _decided(m, now >= m.deadline_at, cancel):
                self.record(m, now)
            elif cancel:
                continue  # stopped by the close: it reports no outcome of its own
            elif m.started:
                self.deferred.at(m.deadline_at, functools.partial(self._at_deadline, m))
            else:
                when = min(m.start_by, m.deadline_at)
                self.deferred.at(when, functools.partial(self.at_start_timeout, m))

    def at_start_timeout(self, m: Lost) -> None:
        """The check at the start timeout of ``m``, a member kept running past its group's
        close and not known to have started: declared not started and recorded lost if
        its worker has not claimed its start; else checked again at its deadline, unless
        its outcome is claimed already."""
        mid, ttl = m.member_id, self.settings.group_ttl_s
        # The start's claim and a look at the outcome's, one round trip: a member that has
        # reported by now (the usual loser kept running) leaves nothing for its deadline.
        holder, outcome_claimed = self.store.claim_and_peek(
            start_key(mid), COORDINATOR, ttl, outcome_key(mid)
        )
        if holder == COORDINATOR:  # declared not started: the claim is held already
            self.record(m, self.clock(), start_claimed=True)
        elif not outcome_claimed:  # it started in time: its own report, or a hang
            started = replace(m, started=True)
            self.deferred.at(m.deadline_at, functools.partial(self._at_deadline, started))

    def _at_deadline(self, m: Lost) -> None:
        """Record a member that did not report by its deadline; a member recorded as hung
        is then stopped (its group cancelled: past the deadline nothing is awaited)."""
        if self.record(m, self.clock()) is FailureKind.TIMEOUT:
            gid, ttl = m.group_id, self.settings.group_ttl_s
            self.store.set_group_state(gid, GroupSignal.CANCELLED, ttl)

    def zone_dark(self, candidate_ids: Sequence[str], now: float) -> None:
        """A member of their zone was not started in time: these candidates sit out
        planning for ``dark_zone_cooldown_s`` (RuntimeStore.set_cooldown)."""
        ttl = self.settings.dark_zone_cooldown_s
        for cid in candidate_ids:
            self.store.set_cooldown(cid, ttl, now + ttl)

    def claim_start(self, member_id: str) -> bool:
        """Declare a member not started (False: its worker started it first)."""
        return claim(self.store, start_key(member_id), COORDINATOR, self.settings.group_ttl_s)

    def record(self, m: Lost, now: float, start_claimed: bool = False) -> FailureKind | None:
        """Record ``m`` as lost unless it started after all (for a member not known to
        have started; ``start_claimed``: this coordinator holds its start claim already)
        or its worker recorded its own outcome first; the failure kind recorded, None
        when nothing was."""
        ttl, mid = self.settings.group_ttl_s, m.member_id
        started = m.started
        if not (started or start_claimed):  # its worker holds the start: it runs, or ran
            started = not claim(self.store, start_key(mid), COORDINATOR, ttl)
        if started and not claim(self.store, outcome_key(mid), COORDINATOR, ttl):
            return None  # it reported, and its worker counted it
        report = lost_report(m.trace_base(), m.why, started, m.launched_at, now)
        obs, legs = observations(report.trace)
        t = report.trace
        s = self.settings
        limits = OutcomeLimits(s.profile_ttl_s, s.trace_stream_maxlen, s.trace_stream_ttl_s)
        self.store.record_outcome(
            t.candidate_id, obs, link_id(t.caller_zone, t.zone), t.caller_zone, t.zone, legs,
            report.model_dump_json(), self.profile_settings, limits,
        )  # fmt: skip
        return t.failure_kind

    def close(self) -> None:
        self.deferred.close()
