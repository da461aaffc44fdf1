"""A hedge group as the coordinator runs it, and what its close records: every member's
summary, the verdict (:class:`schemas.models.GroupVerdict`, harvested into
``invocations``) and the operator counters. Pure functions of the group; the coordinator
(:mod:`coordinator.runtime.coordinator`) does the I/O."""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from coordinator.core.methods import Decision
from coordinator.core.patience import GaveUp, Watch
from coordinator.core.stagger import Launcher
from coordinator.core.winner import Report, Verdict, verdict
from coordinator.runtime.pool import CallSettings
from coordinator.runtime.results import InvocationResult, MemberSummary
from coordinator.runtime.timers import TIMERS, Handle, Timers
from coordinator.state import keys
from coordinator.state.opening import GroupOpening
from schemas.enums import GroupSignal, GroupState, MemberStatus, WinnerMode
from schemas.models import (
    Candidate,
    GroupVerdict,
    MemberReport,
    MemberTask,
    RoleInvocation,
    StagedClose,
)


class Alarm:
    """One pending wake-up of a group; cancelled when replaced or when the group ends.
    Served by the process's one timer thread (coordinator.runtime.timers)."""

    def __init__(self, at_s: float = math.nan, timers: Timers = TIMERS) -> None:
        self.at_s = at_s
        self._timers = timers
        self._handle: Handle | None = None

    def start(self, delay_s: float, action: Callable[[], None]) -> None:
        self._handle = self._timers.schedule(delay_s, action)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


@dataclass
class Group:
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
    watch: Watch  # when members are given up (not started, no report): core.patience
    reports: list[MemberReport | None] = field(default_factory=list)
    launched_at: list[float | None] = field(default_factory=list)
    backups: int = 0
    alarm: Alarm = field(default_factory=Alarm)
    state: GroupState = GroupState.PLANNED  # RUNNING from the first launch, then a verdict
    # The rule that picked the winner and why it is not the asked one (``best`` without
    # judgements: coordinator.runtime.judging), and the winner's judged quality.
    winner_rule: WinnerMode | None = None
    fallback_reason: str | None = None
    stream: bool = False  # members append their deltas to keys.member_chunks (a relay)
    winner_quality: float | None = None
    credited: bool = False  # the hedge budget is credited by the plan (no earn() due)
    # Still to open with the initial launches: the plan read nothing (a fresh cached view).
    opening: GroupOpening | None = None
    # A staged close (coordinator.state.closing): its members carry the group's close
    # should they win with its first report; ``closed_by`` is the rank whose report did
    # (its closed token), ``close_held`` that this coordinator took the close back.
    staged: bool = False
    closed_by: int | None = None
    close_held: bool = False

    def member_id(self, rank: int) -> str:
        return f"{self.id}.{rank}"


def summaries(g: Group, now: float, cancel: bool) -> tuple[list[MemberSummary], list[int]]:
    """Every member's summary at the close, and the ranks of those no longer awaited
    (launched, no report, given up or past the deadline: timed out)."""
    out, lost = [], []
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
        elif rank in g.watch.given_up or now >= g.deadline_at:
            reason = _lost_reason(g, rank)
            out.append(row(MemberStatus.TIMED_OUT, True, now - launched_at, reason))
            lost.append(rank)
        else:
            out.append(row(MemberStatus.CANCELLED if cancel else MemberStatus.RUNNING, True))
    return out, lost


def _lost_reason(g: Group, rank: int) -> str:
    why = g.watch.given_up.get(rank, (None,))[0]
    b = g.watch.budgets[rank]
    if why is GaveUp.NOT_STARTED:
        return f"not started within the start timeout ({b.start_s:.3g} s)"
    if why is GaveUp.NO_REPORT:
        return f"no report within its patience ({b.patience_s:.3g} s after it started)"
    return f"no report within deadline_s={g.call.deadline_s}"


def group_verdict(
    g: Group, state: GroupState, winner: str | None, members: list[MemberSummary], now: float
) -> GroupVerdict:
    """The record of the group's outcome the harvester upserts into ``invocations``."""
    return GroupVerdict(**_verdict_fields(g, state, winner, members, now))


def _verdict_fields(
    g: Group, state: GroupState, winner: str | None, members: list[MemberSummary], now: float
) -> dict[str, Any]:
    by_status = Counter(m.status for m in members if m.launched)
    return dict(
        group_id=g.id,
        role=g.role,
        state=state,
        winner_member=winner,
        p_success=float(g.decision.p_success),
        stop=g.decision.stop,
        launch_mode=g.call.launch_mode,
        winner_mode=g.call.winner_mode,
        started_at_s=g.t0,
        decided_at_s=max(now, g.t0),
        latency_s=max(0.0, now - g.t0),
        planned=len(members),
        launched=sum(by_status.values()),
        succeeded=by_status[MemberStatus.SUCCEEDED],
        failed=by_status[MemberStatus.FAILED],
        timed_out=by_status[MemberStatus.TIMED_OUT],
        cancelled=by_status[MemberStatus.CANCELLED],
        running=by_status[MemberStatus.RUNNING],
        backups=g.backups,
        winner_rule=g.winner_rule,
        fallback_reason=g.fallback_reason,
    )


def launched_reports(g: Group) -> list[Report | None]:
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


def deadline_verdict(g: Group) -> Verdict:
    """At the deadline, an unreported member counts as failed at the deadline."""
    span = g.deadline_at - g.t0
    reps = [r if r is not None else Report(span, False) for r in launched_reports(g)]
    v = verdict(g.call.winner_mode, reps)
    return v if v.winner is not None else Verdict(True, None)


def won_result(g: Group, win: int, members: list[MemberSummary], now: float) -> InvocationResult:
    """What the caller gets from a group won by rank ``win``."""
    rep, c = g.reports[win], g.candidates[win]
    return InvocationResult(
        g.id, g.role, GroupState.WON, g.member_id(win), c.id, c.zone,
        rep.output if rep else None, rep.trace.quality if rep else None,
        g.decision.p_success, g.decision.stop, now - g.t0, members, g.backups,
    )  # fmt: skip


def member_task(g: Group, rank: int, sent: Candidate, caller_zone: str, now: float) -> MemberTask:
    """The task of ``g``'s member of ``rank`` (``sent``: its candidate as workers get it,
    Pool.as_sent), launched at ``now``."""
    d = g.decision
    return MemberTask(
        group_id=g.id,
        member_id=g.member_id(rank),
        rank=rank,
        candidate=sent,
        caller_zone=caller_zone,
        payload=g.payload.payload,
        deadline_at_s=g.deadline_at,
        enqueued_at_s=now,
        u_plus=d.u_plus[rank] if d.u_plus else 0.0,
        r_minus=d.r_minus[rank] if d.r_minus else 0.0,
        idempotency_key=g.payload.idempotency_key,
        stream_to=keys.member_chunks(g.id, rank) if g.stream else None,
    )


def stages_close(g: Group, rank: int) -> bool:
    """Whether the member of ``rank`` wins ``g`` outright should its report be the group's
    first and a success, so it can carry the group's close (a staged close): every
    member is launched (no later launch changes the counts), no stream is relayed, and
    the rule is ``first`` (any rank) or ``ranked`` (rank 0: no one ranks above it)."""
    if g.stream or g.launcher.launched != len(g.candidates):
        return False
    mode = g.call.winner_mode
    return mode is WinnerMode.FIRST or (mode is WinnerMode.RANKED and rank == 0)


def stage_closes(
    g: Group, sends: list[tuple[str, MemberTask]], cancel: bool
) -> list[tuple[str, MemberTask]]:
    """The initial sends, each member that would win with the group's first report
    carrying the close its coordinator would make then (HacoSettings.close_in_report):
    that member succeeded, every other cancelled (``cancel``, HacoSettings.cancel_losers)
    or kept running; the worker fills in when it was decided. Marks ``g`` staged."""
    ranks = {task.rank for _, task in sends if stages_close(g, task.rank)}
    if not ranks:
        return sends
    g.staged = True
    # The counts are the same whichever member wins: one verdict, its winner per rank.
    other = MemberStatus.CANCELLED if cancel else MemberStatus.RUNNING
    statuses = [MemberStatus.SUCCEEDED, *(other for _ in g.candidates[1:])]
    members = [
        MemberSummary(g.member_id(r), c.id, c.zone, r, s, g.launched_at[r] is not None)
        for (r, c), s in zip(enumerate(g.candidates), statuses, strict=True)
    ]
    record = _verdict_fields(g, GroupState.WON, None, members, g.t0)
    record["winner_rule"] = g.call.winner_mode  # as judging.settle records it for these rules
    signal = GroupSignal.CANCELLED if cancel else GroupSignal.RESOLVED

    def close(rank: int) -> StagedClose:
        verdict = GroupVerdict(**{**record, "winner_member": g.member_id(rank)})
        return StagedClose(signal=signal, counts=metrics(g, GroupState.WON, rank), verdict=verdict)

    return [
        (zone, task.model_copy(update={"close": close(task.rank)}) if task.rank in ranks else task)
        for zone, task in sends
    ]


def final_state(g: Group, winner: int | None, now: float) -> GroupState:
    """WON with a winner; else DEADLINE when a launched member is still unreported at
    the deadline, ALL_FAILED when every launched member failed."""
    if winner is not None:
        return GroupState.WON
    if now >= g.deadline_at and any(g.reports[r] is None for r in range(g.launcher.launched)):
        return GroupState.DEADLINE
    return GroupState.ALL_FAILED


def metrics(g: Group, state: GroupState, winner_rank: int | None) -> dict[str, int]:
    """The operator counters a close adds (keys.METRICS)."""
    counts = {"invocations": 1, f"state:{state.value}": 1}
    if g.launcher.launched > 1:
        counts["hedged"] = 1
    if g.backups:
        counts["backups"] = g.backups
        if winner_rank is not None and winner_rank > 0:
            counts["backup_wins"] = 1
    if not g.launcher.timer_on:
        counts["budget_refused"] = 1
    counts[f"launch:{g.call.launch_mode.value}"] = 1
    return counts
