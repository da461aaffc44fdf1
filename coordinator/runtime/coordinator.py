"""The coordinator: a role invocation becomes a hedge group, run to a verdict.

    PLANNED ──launch──▶ RUNNING ──verdict──▶ WON | ALL_FAILED | DEADLINE

The policy (:mod:`coordinator.core.methods`) decides who; :mod:`coordinator.core.stagger` decides
when; :mod:`coordinator.core.winner` decides who won. It plans on the view of
:mod:`coordinator.runtime.viewing` (one read, or none while it is fresh), and carries the
decisions out: it enqueues members through a :class:`Dispatcher`, waits for their reports on the
group's reply list, and closes the group in one atomic step
(:meth:`RuntimeStore.close_group`): the winner claim, the signal that cancels or keeps the
losers, and the verdict record (:func:`coordinator.runtime.group.group_verdict`) that the
harvester stores in ``invocations``. A close that finds the group claimed by another
process with another outcome declares nothing (:class:`WinnerConflictError`).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable

from coordinator.config import HacoSettings
from coordinator.core.cofailure import CoFailure
from coordinator.core.evidence import payload_bytes
from coordinator.core.methods import Haco, PoolView
from coordinator.core.params import PolicyParams, ProfileSettings
from coordinator.core.stagger import Launch, Launcher
from coordinator.core.winner import Verdict, verdict
from coordinator.errors import (
    AllFailedError,
    DeadlineError,
    NotIdempotentError,
    WinnerConflictError,
)
from coordinator.runtime import judging
from coordinator.runtime.group import (
    Alarm,
    Group,
    deadline_verdict,
    final_state,
    group_verdict,
    launched_reports,
    member_task,
    metrics,
    stage_closes,
    summaries,
    won_result,
)
from coordinator.runtime.lead import LaunchLead
from coordinator.runtime.liveness import (
    LostRecorder,
    QueueWaits,
    parse_started,
    unreported,
    watch_for,
)
from coordinator.runtime.pool import Pool
from coordinator.runtime.ports import DelayWindow, Dispatcher, HedgeBudget, RuntimeStore
from coordinator.runtime.results import InvocationResult, MemberSummary
from coordinator.runtime.viewing import Views
from coordinator.state.closing import CloseLimits, GroupClose, GroupClosed, parse_closed
from coordinator.state.ids import hex_id
from schemas.enums import GroupSignal, GroupState, MemberStatus
from schemas.models import Candidate, MemberReport, MemberTask, RoleInvocation

Clock = Callable[[], float]


WAKE = "wake"  # a token on a group's reply list: a timer is due, not a report
WAKE_SLACK_S = 0.05  # the pop's own timeout, only a fallback should a token be lost
REPLY_BATCH = 16  # entries taken per pop: a start token and its report in one round trip


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
        new_id: Callable[[], str] = hex_id,
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
        self.new_id = new_id
        # Liveness (issue 8): queue waits behind the start timeout, lost members' records.
        self.waits = QueueWaits(settings.start_wait_window)
        self.lost = LostRecorder(store, settings, self.profile_settings, clock)
        # The planning read, the cached view, the co-failure evidence (runtime.viewing).
        self.views = Views(pool, store, settings, self.profile_settings, clock)
        self.lead = LaunchLead.of(settings)  # how early a backup's timer runs

    def close(self) -> None:
        """Drop what is pending in this process: the deferred records of lost members
        (coordinator.runtime.liveness), which would otherwise still write after the
        caller is gone."""
        self.lost.close()

    # -- deciding ---------------------------------------------------------------------
    def view(self, role: str, request_bytes: float) -> tuple[list[Candidate], PoolView]:
        """The role's candidates (cooling ones left out) and the policy's view of them."""
        cands, view, _ = self.views.view(role, request_bytes, None, None)
        return cands, view

    def cofailure(self) -> CoFailure | None:
        """The co-failure evidence the policy counts (the latest snapshot's)."""
        return self.views.cofailure()

    def _plan(self, inv: RoleInvocation, group_id: str | None = None) -> Group:
        if not inv.idempotent and inv.require_hedge:  # refused before anything is written
            raise NotIdempotentError(
                f"role {inv.role!r}: the call is not idempotent (idempotent=false) but "
                "require_hedge=true; a call with side effects cannot run on several candidates"
            )
        call = self.pool.call_settings(inv, self.settings, self.params)
        request_bytes = payload_bytes(inv.payload)  # k: the JSON messages (spec §13)
        group_id = group_id or self.new_id()
        # The group is opened, and the budget credited, by the round trip that reads the
        # profiles; or, when no read was due, by the one that sends the first members.
        credit = self.budget.plan_credit()
        cands, view, read = self.views.view(inv.role, request_bytes, group_id, credit)
        opening = self.views.opening(read, group_id, credit)
        decision = Haco(call.params).choose(view)  # in floats for a small pool (core.smallpool)
        members = decision.members
        if not inv.idempotent:
            members = members[:1]  # side effects: the best-ranked candidate alone
        t0 = self.clock()
        # No delay yet: it is read once rank 0 is on its way (_launch_initial).
        launcher = Launcher(call.launch_mode, len(members), math.inf, t0)
        n = len(members)
        chosen = [cands[i] for i in members]
        t_proc = [float(view.stats.t_proc_s[i]) for i in members]
        watch = watch_for(self.settings, self.waits, self.pool.config.sim, chosen, t_proc)
        return Group(
            id=group_id,
            role=inv.role,
            call=call,
            decision=decision,
            candidates=[cands[i] for i in members],
            t0=t0,
            deadline_at=t0 + call.deadline_s,
            launcher=launcher,
            payload=inv,
            request_bytes=request_bytes,
            watch=watch,
            reports=[None] * n,
            launched_at=[None] * n,
            credited=read.credited or (opening is not None and credit is not None),
            opening=opening,
        )

    # -- running ----------------------------------------------------------------------
    def invoke(self, inv: RoleInvocation, group_id: str | None = None) -> InvocationResult:
        """Run ``inv`` to its verdict; ``group_id`` fixes the group's id (HacoClient.submit
        assigns it up front), else a new one is drawn."""
        g = self._plan(inv, group_id)  # the group is open: read_for_plan opened it
        self._launch_initial(g)
        if not g.credited:
            self.budget.earn()  # after the launch: off the first member's path
        v = self._wait(g)
        # ``best`` waits for the judge when outputs came back unjudged (runtime.judging).
        evaluator = self.pool.config.evaluator is not None
        v = judging.settle(g, v, self.store, self.clock, self.settings, evaluator)
        return judging.annotate(self._finish(g, v), g)

    def _launch(self, g: Group, launch: Launch, timer_s: float) -> None:
        """``timer_s``: when ``launch`` came due (a backup's path is measured from it)."""
        prepared = self._prepare(g, launch)
        if prepared is not None:
            if launch.charged:  # a backup: its path from its timer, the next lead's sample
                self.lead.record(self.clock() - timer_s)
            self.dispatcher.send(*prepared)

    def _launch_initial(self, g: Group) -> None:
        """The initial launches (also runtime.aio's) in one send_many: one round trip."""
        sends = [p for x in g.launcher.initial() if (p := self._prepare(g, x)) is not None]
        if self.settings.close_in_report:
            sends = stage_closes(g, sends, self.settings.cancel_losers)
        opening, g.opening = g.opening, None
        if sends:
            self.dispatcher.send_many(sends, opening)
        elif opening is not None:
            opening.open()
        if g.launcher.timed:
            # The rolling delay (a Redis read) only when a timer can use it, and after
            # rank 0's send: the backup's timer needs it, rank 0 does not wait for it.
            g.launcher.delay_s = self.delays.delay_s(g.role)
            g.launcher.lead_s = self.lead.lead_s()

    def _prepare(self, g: Group, launch: Launch) -> tuple[str, MemberTask] | None:
        """Charge ``launch`` (a backup) to the budget and note it launched; its (zone,
        task) to send, or None when the budget refused it."""
        now = self.clock()
        if launch.charged:
            # A backup costs at least its input tokens; output tokens are not known yet.
            tokens = g.request_bytes / self.profile_settings.bytes_per_token
            if not self.budget.try_spend(1, tokens):
                g.launcher.on_budget_refused()
                return None
            g.backups += 1
        cand = g.candidates[launch.rank]
        sent, caller = self.pool.as_sent(cand), self.pool.config.caller_zone
        task = member_task(g, launch.rank, sent, caller, now)
        g.launched_at[launch.rank] = now
        g.watch.on_launch(launch.rank, now)
        g.launcher.on_launch(launch, now)
        g.state = GroupState.RUNNING
        return cand.zone, task

    def _verdict(self, g: Group) -> Verdict:
        if g.closed_by is not None and g.reports[g.closed_by] is not None:
            return Verdict(True, g.closed_by)  # its own report closed the group: it won
        # A member given up on (core.patience) reads as failed: it holds back no one.
        v = verdict(g.call.winner_mode, g.watch.reports(launched_reports(g), g.t0))
        if v.all_failed and g.launcher.pending:
            return Verdict(False)  # not all failed yet: a replacement is due
        return v

    def _wait(self, g: Group) -> Verdict:
        try:
            return self._wait_loop(g)
        finally:
            g.alarm.cancel()

    def _arm(self, g: Group, wake_s: float, now_s: float) -> None:
        """Wake the blocking pop at ``wake_s``: Redis checks blocking timeouts only on
        its own clock tick (hz, 100 ms by default), far too coarse for a hedge delay, so
        a timer pushes a wake token onto the group's reply list instead."""
        if wake_s == g.alarm.at_s:
            return
        g.alarm.cancel()
        g.alarm = Alarm(wake_s)
        push = functools.partial(self.store.push_reply, g.id, WAKE, self.settings.group_ttl_s)
        g.alarm.start(max(0.0, wake_s - now_s), push)

    def _tick(self, g: Group, now: float) -> Verdict | None:
        """One step of the wait (also the async path's, coordinator.runtime.aio): give up
        on silent members, launch what is due, decide; None: keep waiting."""
        self._give_up(g, now)
        while (launch := g.launcher.due(now)) is not None:
            before = g.launcher.launched
            self._launch(g, launch, g.launcher.wake_at())
            if g.launcher.launched == before:
                break  # the budget refused a backup: wait on what runs
        v = self._verdict(g)
        if v.decided:
            return v
        if now >= g.deadline_at:
            return deadline_verdict(g)
        return None

    def _wait_loop(self, g: Group) -> Verdict:
        while True:
            now = self.clock()
            if (v := self._tick(g, now)) is not None:
                return v
            launch_s = g.launcher.wake_at()
            wake = min(g.deadline_at, launch_s, g.watch.wake_at())
            if launch_s < g.deadline_at:
                # Only launch timers need the precision; a deadline or a member's
                # patience (seconds) may run late by Redis's tick (≤ 100 ms at the
                # default hz) without harm, and arming costs a timer-thread wake-up.
                self._arm(g, launch_s, now)
            timeout_s = max(0.0, min(wake - now + WAKE_SLACK_S, 1.0))
            for raw in self.store.pop_replies(g.id, timeout_s, REPLY_BATCH):
                if raw != WAKE:
                    self._on_entry(g, raw)

    def _on_entry(self, g: Group, raw: str) -> None:
        rank = parse_started(raw)
        if rank is None:
            won = parse_closed(raw)
            if won is None:
                self._on_report(g, MemberReport.model_validate_json(raw))
            elif g.staged and won < len(g.candidates):
                g.closed_by = won  # its report, next on the list, closed the group
        elif rank < len(g.candidates):
            wait = g.watch.on_started(rank, self.clock())
            if wait is not None:
                self.waits.record(g.candidates[rank].zone, wait)

    def _give_up(self, g: Group, now: float) -> None:
        """Members not started in time, or started and silent past their patience, no
        longer hold the group back: a failure for the launcher (a replacement is due)."""
        for rank in g.watch.due(now):
            if g.staged and not g.close_held and len(g.candidates) > 1:
                # Its close must count this member as given up: no report closes it now.
                self.store.hold_close(g.id, self.settings.group_ttl_s)
                g.close_held = True
            if g.watch.started(rank):
                g.launcher.on_report(False)
            elif self.lost.claim_start(g.member_id(rank)):  # never: its zone is dark
                g.launcher.on_report(False)
                zone = g.candidates[rank].zone
                dark = [c.id for c in self.pool.config.candidates if c.zone == zone]
                self.lost.zone_dark(dark, now)
                self.views.mark_stale(g.role)
            else:  # its worker took it just now: it started
                g.watch.on_started(rank, now)

    def _on_report(self, g: Group, rep: MemberReport) -> None:
        rank = rep.trace.rank
        if rank >= len(g.reports) or g.reports[rank] is not None:
            return  # a duplicate delivery, or not ours
        if g.watch.gave_up_unstarted(rank):
            return  # declared not started: its worker's refusal to start, recorded lost
        g.reports[rank] = rep
        if rep.trace.status in (MemberStatus.FAILED, MemberStatus.TIMED_OUT):
            self.views.mark_stale(g.role)
        if not g.watch.started(rank):  # it reported before its start token was due
            # Its queue wait from the trace's start (the workers' start-notice delay).
            wait = g.watch.on_started(rank, min(self.clock(), rep.trace.started_at_s))
            if wait is not None:
                self.waits.record(g.candidates[rank].zone, wait)
        given_up = rank in g.watch.given_up  # the launcher already counted it as failed
        g.watch.on_report(rank)
        if rep.trace.success or not given_up:
            g.launcher.on_report(rep.trace.success)

    def _finish(self, g: Group, v: Verdict) -> InvocationResult:
        now = self.clock()
        state = final_state(g, v.winner, now)
        # Past the deadline nothing more is awaited: stragglers are cancelled, and only
        # then recorded as lost (a kept member would report its own outcome later, and
        # recording it here too would count the call twice).
        cancel = self.settings.cancel_losers or state is not GroupState.WON or now >= g.deadline_at
        win = v.winner if state is GroupState.WON else None
        winner_id = g.member_id(win) if win is not None else None
        members, _ = summaries(g, now, cancel)
        record = functools.partial(group_verdict, g, state, winner_id, members, now)
        closed = self._close(g, state, win, cancel, lambda: record().model_dump_json())
        if closed.winner_member != winner_id:
            if (won := self._adopt(g, closed.winner_member)) is not None:
                return self._finish(g, Verdict(True, won))
            # Another process closed this group first, with another outcome: its claim
            # holds, and this coordinator declares no second one.
            raise WinnerConflictError(g.id, winner_id, closed.winner_member)
        g.state = state
        if closed.applied:
            self._record_lost(g, now, cancel)
        if win is not None:
            return won_result(g, win, members, now)
        failures = {m.member_id: m.reason or m.status.value for m in members if m.launched}
        if state is GroupState.DEADLINE:
            raise DeadlineError(g.id, g.call.deadline_s, failures)
        raise AllFailedError(g.id, failures)

    def _close(
        self, g: Group, state: GroupState, win: int | None, cancel: bool, record: Callable[[], str]
    ) -> GroupClosed:
        """One atomic step: the signal (losers see it at their next poll), the winner claim
        (one outcome per group), the operator counters and the verdict ``record``; made
        already when the winner's own report closed the group (coordinator.state.closing)."""
        winner_id = g.member_id(win) if win is not None else None
        if win is not None and win == g.closed_by:
            return GroupClosed(True, winner_id)
        signal = GroupSignal.CANCELLED if cancel else GroupSignal.RESOLVED
        s = self.settings
        limits = CloseLimits(
            s.group_ttl_s, s.profile_ttl_s, s.trace_stream_maxlen, s.trace_stream_ttl_s
        )
        close = GroupClose(g.id, signal, winner_id, metrics(g, state, win), record())
        return self.store.close_group(close, limits)

    def _adopt(self, g: Group, holder: str | None) -> int | None:
        """The rank whose report closed the group (a staged close) while this coordinator
        decided otherwise (it gave up on that member, or its deadline came first): that
        close holds, and its token and report are on the reply list, read here. None: the
        group was closed by another process, or the report is not there."""
        if not g.staged or holder is None:
            return None
        while g.closed_by is None or g.reports[g.closed_by] is None:
            entries = self.store.pop_replies(g.id, 0.0, REPLY_BATCH)
            if not entries:
                return None
            for raw in entries:
                if raw != WAKE:
                    self._on_entry(g, raw)
        return g.closed_by if g.member_id(g.closed_by) == holder else None

    def _record_lost(self, g: Group, now: float, cancel: bool) -> None:
        """Members launched without a report count against their candidate or its link
        when they are lost (coordinator.runtime.liveness), with a trace: now, or at the
        deadline when they may still report."""
        lost = unreported(g, self.pool.config.caller_zone)
        if lost:
            self.lost.on_close(lost, now, cancel)


__all__ = ["Coordinator", "Dispatcher", "InvocationResult", "MemberSummary"]
