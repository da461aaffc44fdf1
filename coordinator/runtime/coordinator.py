"""The coordinator: a role invocation becomes a hedge group, run to a verdict.

    PLANNED ──launch──▶ RUNNING ──verdict──▶ WON | ALL_FAILED | DEADLINE

The policy (:mod:`coordinator.core.methods`) decides who; :mod:`coordinator.core.stagger` decides
when; :mod:`coordinator.core.winner` decides who won. This module carries the decisions
out: it enqueues members through a :class:`Dispatcher`, waits for their reports on the
group's reply list, claims the winner atomically, and cancels or keeps the losers.
"""

from __future__ import annotations

import functools
import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from coordinator.config import HacoSettings
from coordinator.core.evidence import PoolMember, build_view, link_id
from coordinator.core.methods import Decision, Haco, PoolView
from coordinator.core.params import PolicyParams, ProfileSettings
from coordinator.core.profiles import CandidateObservation
from coordinator.core.stagger import Launch, Launcher
from coordinator.core.winner import Report, Verdict, verdict
from coordinator.errors import AllFailedError, DeadlineError, NotIdempotentError
from coordinator.runtime.pool import CallSettings, Pool
from coordinator.runtime.ports import DelayWindow, Dispatcher, HedgeBudget, RuntimeStore
from coordinator.runtime.results import InvocationResult, MemberSummary
from coordinator.state.store import CANCELLED, RESOLVED
from schemas.enums import FailureKind, GroupState, LaunchMode, MemberStatus
from schemas.models import Candidate, MemberReport, MemberTask, RoleInvocation

Clock = Callable[[], float]


WAKE = "wake"  # a token on a group's reply list: a timer is due, not a report
WAKE_SLACK_S = 0.05  # the pop's own timeout, only a fallback should a token be lost


class _Alarm:
    """One pending wake-up of a group; cancelled when replaced or when the group ends."""

    def __init__(self, at_s: float = math.nan) -> None:
        self.at_s = at_s
        self._timer: threading.Timer | None = None

    def start(self, delay_s: float, action: Callable[[], None]) -> None:
        self._timer = threading.Timer(delay_s, action)
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


@dataclass
class _Group:
    id: str
    role: str
    call: CallSettings
    decision: Decision
    candidates: list[Candidate]  # in rank order
    t0: float
    deadline_at: float
    launcher: Launcher
    payload: RoleInvocation
    request_bytes: int
    reports: list[MemberReport | None] = field(default_factory=list)
    launched_at: list[float | None] = field(default_factory=list)
    backups: int = 0
    alarm: _Alarm = field(default_factory=_Alarm)

    def member_id(self, rank: int) -> str:
        return f"{self.id}.{rank}"


class Coordinator:
    def __init__(
        self,
        pool: Pool,
        store: RuntimeStore,
        dispatcher: Dispatcher,
        budget: HedgeBudget,
        delays: DelayWindow,
        settings: HacoSettings,
        params: PolicyParams | None = None,
        profile_settings: ProfileSettings | None = None,
        clock: Clock = time.time,
        rng: np.random.Generator | None = None,
        new_id: Callable[[], str] = lambda: uuid.uuid4().hex[:20],
    ) -> None:
        self.pool = pool
        self.store = store
        self.dispatcher = dispatcher
        self.budget = budget
        self.delays = delays
        self.settings = settings
        self.params = params or PolicyParams()
        self.profile_settings = profile_settings or ProfileSettings()
        self.clock = clock
        self.rng = rng or np.random.default_rng()
        self.new_id = new_id

    # -- deciding ---------------------------------------------------------------------
    def view(self, role: str, request_bytes: float) -> tuple[list[Candidate], PoolView]:
        cands = self.pool.candidates(role)
        for c in cands:
            self.pool.check_zone(c.zone)
        caller = self.pool.config.caller_zone
        lids = sorted({link_id(caller, c.zone) for c in cands})
        profiles, links = self.store.load_profiles([c.id for c in cands], lids)
        members = [PoolMember(c.id, c.zone) for c in cands]
        view = build_view(members, caller, profiles, links, request_bytes, self.profile_settings)
        return cands, view

    def _plan(self, inv: RoleInvocation) -> _Group:
        call = self.pool.call_settings(inv, self.settings, self.params)
        request_bytes = len("".join(m.content for m in inv.payload).encode("utf-8"))
        cands, view = self.view(inv.role, request_bytes)
        decision = Haco(call.params).decide(view, self.rng)
        members = decision.members
        if not inv.idempotent:
            if inv.require_hedge:
                raise NotIdempotentError(
                    f"role {inv.role!r}: the call is not idempotent (idempotent=false) but "
                    "require_hedge=true; a call with side effects cannot run on several candidates"
                )
            members = members[:1]  # side effects: the best-ranked candidate alone
        t0 = self.clock()
        # The rolling delay is read only when a timer can use it (a Redis round trip).
        staggered = call.launch_mode is LaunchMode.STAGGERED and len(members) > 1
        delay_s = self.delays.delay_s(inv.role) if staggered else math.inf
        launcher = Launcher(call.launch_mode, len(members), delay_s, t0)
        n = len(members)
        return _Group(
            id=self.new_id(),
            role=inv.role,
            call=call,
            decision=decision,
            candidates=[cands[i] for i in members],
            t0=t0,
            deadline_at=t0 + call.deadline_s,
            launcher=launcher,
            payload=inv,
            request_bytes=request_bytes,
            reports=[None] * n,
            launched_at=[None] * n,
        )

    # -- running ----------------------------------------------------------------------
    def invoke(self, inv: RoleInvocation) -> InvocationResult:
        g = self._plan(inv)
        self.store.open_group(g.id, self.settings.group_ttl_s)
        self.budget.earn()
        for launch in g.launcher.initial():
            self._launch(g, launch)
        v = self._wait(g)
        return self._finish(g, v)

    def _launch(self, g: _Group, launch: Launch) -> None:
        now = self.clock()
        if launch.charged:
            # A backup costs at least its input tokens; output tokens are not known yet.
            tokens = g.request_bytes / self.profile_settings.bytes_per_token
            if not self.budget.try_spend(1, tokens):
                g.launcher.on_budget_refused()
                return
            g.backups += 1
        cand = g.candidates[launch.rank]
        d = g.decision
        task = MemberTask(
            group_id=g.id,
            member_id=g.member_id(launch.rank),
            rank=launch.rank,
            candidate=self._with_sim(cand),
            caller_zone=self.pool.config.caller_zone,
            payload=g.payload.payload,
            deadline_at_s=g.deadline_at,
            enqueued_at_s=now,
            u_plus=d.u_plus[launch.rank] if d.u_plus else 0.0,
            r_minus=d.r_minus[launch.rank] if d.r_minus else 0.0,
            idempotency_key=g.payload.idempotency_key,
        )
        g.launched_at[launch.rank] = now
        g.launcher.on_launch(launch, now)
        self.dispatcher.send(cand.zone, task)

    def _with_sim(self, cand: Candidate) -> Candidate:
        sim = self.pool.config.sim
        if cand.backend.kind != "sim" or sim is None or "sim" in cand.backend.settings:
            return cand
        settings = {**cand.backend.settings, "sim": sim.model_dump(mode="json")}
        return cand.model_copy(
            update={"backend": cand.backend.model_copy(update={"settings": settings})}
        )

    def _reports(self, g: _Group) -> list[Report | None]:
        """Reports of the launched prefix, relative to the group start."""
        out: list[Report | None] = []
        for rank in range(g.launcher.launched):
            rep = g.reports[rank]
            if rep is None:
                out.append(None)
            else:
                t = rep.trace
                out.append(Report(t.finished_at_s - g.t0, t.success, t.quality))
        return out

    def _verdict(self, g: _Group) -> Verdict:
        v = verdict(g.call.winner_mode, self._reports(g))
        if v.all_failed and g.launcher.pending:
            return Verdict(False)  # not all failed yet: a replacement is due
        return v

    def _wait(self, g: _Group) -> Verdict:
        try:
            return self._wait_loop(g)
        finally:
            g.alarm.cancel()

    def _arm(self, g: _Group, wake_s: float, now_s: float) -> None:
        """Wake the blocking pop at ``wake_s``: Redis checks blocking timeouts only on
        its own clock tick (hz, 100 ms by default), far too coarse for a hedge delay, so
        a timer pushes a wake token onto the group's reply list instead."""
        if wake_s == g.alarm.at_s:
            return
        g.alarm.cancel()
        g.alarm = _Alarm(wake_s)
        push = functools.partial(self.store.push_reply, g.id, WAKE, self.settings.group_ttl_s)
        g.alarm.start(max(0.0, wake_s - now_s), push)

    def _wait_loop(self, g: _Group) -> Verdict:
        while True:
            now = self.clock()
            while (launch := g.launcher.due(now)) is not None:
                before = g.launcher.launched
                self._launch(g, launch)
                if g.launcher.launched == before:
                    break  # the budget refused a backup: wait on what runs
            v = self._verdict(g)
            if v.decided:
                return v
            if now >= g.deadline_at:
                return self._deadline_verdict(g)
            timer_s = g.launcher.wake_at()
            wake = min(g.deadline_at, timer_s)
            if timer_s < g.deadline_at:
                # Only launch timers need the precision; a deadline may run late by
                # Redis's tick (≤ 100 ms at the default hz) without harm.
                self._arm(g, wake, now)
            raw = self.store.pop_reply(g.id, max(0.0, min(wake - now + WAKE_SLACK_S, 1.0)))
            if raw is not None and raw != WAKE:
                self._on_report(g, MemberReport.model_validate_json(raw))

    def _on_report(self, g: _Group, rep: MemberReport) -> None:
        rank = rep.trace.rank
        if rank >= len(g.reports) or g.reports[rank] is not None:
            return  # a duplicate delivery, or not ours
        g.reports[rank] = rep
        g.launcher.on_report(rep.trace.success)

    def _deadline_verdict(self, g: _Group) -> Verdict:
        span = g.deadline_at - g.t0
        reps = [r if r is not None else Report(span, False) for r in self._reports(g)]
        v = verdict(g.call.winner_mode, reps)
        return v if v.winner is not None else Verdict(True, None)

    def _finish(self, g: _Group, v: Verdict) -> InvocationResult:
        now = self.clock()
        state = self._state(g, v, now)
        # Past the deadline nothing more is awaited: stragglers are cancelled, and only
        # then recorded as lost (a kept member would report its own outcome later, and
        # recording it here too would count the call twice).
        cancel = self.settings.cancel_losers or state is not GroupState.WON or now >= g.deadline_at
        win = v.winner
        winner_id = g.member_id(win) if state is GroupState.WON and win is not None else None
        # One round trip: the new state (losers see it at their next poll), the winner
        # claim (SET NX: exactly one winner) and the operator counters.
        self.store.close_group(
            g.id,
            CANCELLED if cancel else RESOLVED,
            winner_id,
            self._metrics(g, state, v),
            self.settings.group_ttl_s,
            self.settings.profile_ttl_s,
        )
        members = self._summaries(g, now, cancel)
        if state is GroupState.WON and win is not None:
            rep = g.reports[win]
            c = g.candidates[win]
            return InvocationResult(
                g.id,
                g.role,
                state,
                g.member_id(win),
                c.id,
                c.zone,
                rep.output if rep else None,
                rep.trace.quality if rep else None,
                g.decision.p_success,
                g.decision.stop,
                now - g.t0,
                members,
                g.backups,
            )
        failures = {m.member_id: m.reason or m.status.value for m in members if m.launched}
        if state is GroupState.DEADLINE:
            raise DeadlineError(g.id, g.call.deadline_s, failures)
        raise AllFailedError(g.id, failures)

    def _state(self, g: _Group, v: Verdict, now: float) -> GroupState:
        if v.winner is not None:
            return GroupState.WON
        if now >= g.deadline_at and any(g.reports[r] is None for r in range(g.launcher.launched)):
            return GroupState.DEADLINE
        return GroupState.ALL_FAILED

    def _summaries(self, g: _Group, now: float, cancel: bool) -> list[MemberSummary]:
        out = []
        for rank, cand in enumerate(g.candidates):
            rep, launched_at = g.reports[rank], g.launched_at[rank]
            row = functools.partial(MemberSummary, g.member_id(rank), cand.id, cand.zone, rank)
            if rep is not None:
                t = rep.trace
                out.append(
                    row(t.status, True, t.latency_s, t.failure_reason, t.tokens_in, t.tokens_out)
                )
            elif launched_at is None:
                out.append(row(MemberStatus.QUEUED, False))
            elif now >= g.deadline_at:
                reason = f"no report within deadline_s={g.call.deadline_s}"
                out.append(row(MemberStatus.TIMED_OUT, True, now - launched_at, reason))
                self._record_lost(g, rank, cand, now)
            else:
                out.append(row(MemberStatus.CANCELLED if cancel else MemberStatus.RUNNING, True))
        return out

    def _record_lost(self, g: _Group, rank: int, cand: Candidate, now: float) -> None:
        """A member that never reported by the deadline (its worker may be gone) is
        recorded as timed out, so the failure is harvested and profiled."""
        obs = CandidateObservation(at_s=now, delivered=False, failure=FailureKind.DEADLINE)
        self.store.update_candidate(
            cand.id, obs, self.profile_settings, self.settings.profile_ttl_s
        )

    def _metrics(self, g: _Group, state: GroupState, v: Verdict) -> dict[str, int]:
        counts = {"invocations": 1, f"state:{state.value}": 1}
        if g.launcher.launched > 1:
            counts["hedged"] = 1
        if g.backups:
            counts["backups"] = g.backups
            if v.winner is not None and v.winner > 0:
                counts["backup_wins"] = 1
        if not g.launcher.timer_on:
            counts["budget_refused"] = 1
        counts[f"launch:{g.call.launch_mode.value}"] = 1
        return counts


__all__ = ["Coordinator", "Dispatcher", "InvocationResult", "MemberSummary"]
