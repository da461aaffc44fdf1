"""One member of a hedge group, from dequeue to report. Independent of Celery, so the
same code runs in a Celery worker and in the in-process dispatcher.

Order of work: check the group (a cancelled, resolved-and-cancelling or vanished group's
member never starts; nor one past its deadline), run the backend with a cooperative
cancel check, commit the side effect at most once per idempotency key, then report: the
reply first (it is on the caller's critical path), with, for a member that carries its
group's close, that close when its report is the group's first and a success
(coordinator.state.closing); then, once the reply is written, what the call taught into
the shared profiles, the trace stream and the role's hedge-delay window (harvesting).
A member stopped by a cancel past its deadline replies and harvests nothing: its
coordinator records it lost. The start is one Redis round trip, the report one and its
harvest another (coordinator.state.memberops); a member that wakes an idle member lane
makes its start in the lane's round trip that records its message instead
(:func:`begin_member`, :func:`run_begun`: workers.lane).
Last, a success that came back without a judged quality (a real backend) goes to the
judge, when one is configured.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from coordinator.config import HacoSettings
from coordinator.core.evidence import link_id
from coordinator.core.observations import observations
from coordinator.core.params import ProfileSettings
from coordinator.core.profiles import LinkObservation
from coordinator.errors import StoreError
from coordinator.runtime import liveness
from coordinator.runtime.ports import DelayWindow, RuntimeStore
from coordinator.state.cancelwatch import CancelWatcher, Watch
from coordinator.state.closing import GroupClose, closed_token
from coordinator.state.memberops import (
    BrokerAck,
    MemberOutcome,
    MemberStart,
    OutcomeLimits,
    Started,
)
from schemas.enums import FailureKind, GroupSignal, MemberStatus
from schemas.models import MemberReport, MemberTask
from workers.backends.base import Backend, BackendResult, DeltaBackend, StopCheck
from workers.lane_messages import task_payload
from workers.member_report import member_report, not_started, status_of
from workers.startnotice import StartNotice
from workers.streamsink import ChunkSink, streaming_stop

log = logging.getLogger(__name__)
# A member whose coordinator declared it not started in time never starts later.
DECLARED_LOST = "declared lost: not started within the start timeout"

Clock = Callable[[], float]


@dataclass
class MemberContext:
    """What a worker process needs to run members: shared state and backends."""

    store: RuntimeStore
    backends: Callable[[MemberTask], Backend]
    settings: HacoSettings
    delays: DelayWindow | None = None
    profile_settings: ProfileSettings = field(default_factory=ProfileSettings)
    clock: Clock = time.time
    # Enqueues a judge task (workers.app: the haco.judge queue); None = no evaluator.
    judge: Callable[[MemberTask, MemberReport], None] | None = None
    # The process's cancel watcher (coordinator.state.cancelwatch): a running member's
    # cancel check is in memory. None: the member reads its group's state at every check
    # (one Redis read per check: the polling a watcher replaces).
    cancels: CancelWatcher | None = None
    # ``delays`` is the store's own window (RedisDelayWindow on the same Redis as a
    # RedisStore): the harvest script records the latency sample, no round trip of its own.
    delays_in_store: bool = False


@dataclass(slots=True)
class Beginning:
    """A member's start made outside its run: the member lane, woken by a message, records
    it and makes its start in one round trip (workers.lane), then runs it
    (:func:`run_begun`). Its cancel watch is registered before the start reads the group's
    signal, as :func:`execute_member` registers it; ``state`` and ``started`` are the
    start's answer, set once it came (``made``). A member taken with another one is begun
    in its own thread, and :func:`run_begun` makes its start (``made`` still False)."""

    task: MemberTask
    now: float  # the member's start, as its trace records it
    start: MemberStart
    watch: Watch | None = None
    state: GroupSignal | None = None
    started: Started = Started.NOT_STARTED
    made: bool = False  # the start was made, and state and started are its answer

    def close(self) -> None:
        """Release the watch (after the run, or when the member never runs here)."""
        if self.watch is not None:
            self.watch.close()


def _start_of(task: MemberTask, ctx: MemberContext, now: float) -> MemberStart:
    """The member's one read of its group, its start claim and its started token."""
    token, delay_s = liveness.started_token(task.rank), ctx.settings.started_notice_delay_s
    return MemberStart(
        task.group_id, liveness.start_key(task.member_id), token if delay_s <= 0 else "",
        liveness.WORKER, now > task.deadline_at_s, ctx.settings.group_ttl_s,
    )  # fmt: skip


def begin_member(task: MemberTask, ctx: MemberContext) -> Beginning:
    """``task``'s start, for a caller that makes it in its own round trip: the watch first."""
    watch = ctx.cancels.watch(task.group_id) if ctx.cancels is not None else None
    now = ctx.clock()
    return Beginning(task, now, _start_of(task, ctx, now), watch)


def run_begun(b: Beginning, ctx: MemberContext, ack: BrokerAck | None = None) -> MemberReport:
    """Run a member whose start was made (:func:`begin_member`) to its report."""
    try:
        stop = b.watch if b.watch is not None else _polling(ctx.store, b.task.group_id)
        return _execute(b.task, ctx, stop, ack, b)
    finally:
        b.close()


# A member message's body: its one argument, no keyword arguments, Celery's embed.
MEMBER_BODY = TypeAdapter(tuple[tuple[MemberTask], dict[str, Any], dict[str, Any]])


class LaneStarts:
    """The member lane's starts (workers.lane.Starts): a member that wakes an idle worker
    is validated by the thread that takes it and starts in the round trip that records
    its message."""

    def __init__(self, context: Callable[[], MemberContext]) -> None:
        self.context = context

    def begin(self, body: bytes) -> Beginning | None:
        try:
            # The message's body as the dispatcher writes it ([[task], {}, embed]), its
            # JSON read and the task validated in one pass of pydantic.
            task = MEMBER_BODY.validate_json(body)[0][0]
        except ValidationError:
            try:  # another sender's layout (the task as a keyword argument, say)
                task = MemberTask.model_validate(task_payload(body))
            except ValidationError:
                return None  # its plain run (workers.app.run_member) logs it and drops it
        return begin_member(task, self.context())

    def run(self, b: Beginning, ack: BrokerAck) -> None:
        run_begun(b, self.context(), ack)


def execute_member(
    task: MemberTask, ctx: MemberContext, ack: BrokerAck | None = None
) -> MemberReport:
    """Run ``task`` to its report; ``ack``: its Celery message, acknowledged by the
    report's own script (workers.app.script_ack) when nothing follows the report."""
    if ctx.cancels is None:
        return _execute(task, ctx, _polling(ctx.store, task.group_id), ack)
    # Registered with the watcher before the state is read: a cancel published after the
    # read reaches the watcher, one published before it is seen by the read.
    with ctx.cancels.watch(task.group_id) as stop:
        return _execute(task, ctx, stop, ack)


def _polling(store: RuntimeStore, group_id: str) -> StopCheck:
    return lambda: store.group_state(group_id) is GroupSignal.CANCELLED


def _execute(
    task: MemberTask,
    ctx: MemberContext,
    should_stop: StopCheck,
    ack: BrokerAck | None,
    begun: Beginning | None = None,
) -> MemberReport:
    store = ctx.store
    if begun is not None and begun.made:  # in the round trip that took its message (lane)
        now, state, started = begun.now, begun.state, begun.started
    else:
        # The member's one read of its group, its start claim and its started token: one
        # round trip (coordinator.state.memberops).
        now = begun.now if begun is not None else ctx.clock()
        start = begun.start if begun is not None else _start_of(task, ctx, now)
        state, started = store.start_member(start)
    token, delay_s = liveness.started_token(task.rank), ctx.settings.started_notice_delay_s
    if started is not Started.RUN:
        # Never started. Its reply still goes back so a waiting coordinator knows; no
        # profile learns from a call that did not happen.
        if state is None or state is GroupSignal.CANCELLED:  # the group is gone or cancelled
            report = not_started(task, FailureKind.CANCELLED, f"group {state or 'gone'}", now)
        elif started is Started.NOT_STARTED:
            report = not_started(task, FailureKind.DEADLINE, "deadline passed before start", now)
        else:  # its coordinator declared it not started in time
            report = not_started(task, FailureKind.CANCELLED, DECLARED_LOST, now)
        _reply(task, report, ctx)
        return report
    notice = None
    if delay_s > 0:  # the start token only if the member runs that long (workers.startnotice)
        notice = StartNotice(store, task.group_id, token, ctx.settings.group_ttl_s, delay_s)
    try:
        backend = ctx.backends(task)
        result = _call(task, backend, should_stop, ctx)
    finally:
        if notice is not None:
            notice.finish()
    if result.retry_after_s is not None:  # rate limited: not planned until it expires
        _cool_down(task, result.retry_after_s, ctx)
    outcome = _commit_once(task, backend, result, ctx)
    finished = ctx.clock()
    report = member_report(task, outcome, now, finished, status_of(outcome))
    if result.failure is FailureKind.CANCELLED and finished >= task.deadline_at_s:
        # Stopped past its deadline: by its coordinator's deadline close, which records it
        # lost (a hang: TIMEOUT, coordinator.runtime.liveness). The reply alone, so that
        # record, not this cancellation, is the member's outcome whichever comes first.
        _reply(task, report, ctx)
        return report
    # The reply, then what the call taught (coordinator.core.observations) — even when its
    # side effect was not committed because another member held the idempotency key
    # first — unless its coordinator already recorded it as lost (never counted twice).
    # A report the judge follows keeps kombu's ack after the task: until the judge task
    # is queued, a worker lost here still has the member's message redelivered.
    judged = _judge_due(report, ctx)
    _report_and_harvest(task, result.link_observations, report, ctx, None if judged else ack)
    if judged:
        _send_to_judge(task, report, ctx)
    return report


def _call(task: MemberTask, backend: Backend, stop: StopCheck, ctx: MemberContext) -> BackendResult:
    """The backend's call; a relayed one (``stream_to``) appends its deltas as they arrive,
    then its end entry, before the member reports (workers.streamsink)."""
    if task.stream_to is None:
        return backend.call(task, stop)
    sink = ChunkSink(ctx.store, task.stream_to, ctx.settings.group_ttl_s)
    stop = streaming_stop(stop, ctx.store, task)
    if isinstance(backend, DeltaBackend):
        result = backend.call_streamed(task, stop, sink)
    else:
        result = backend.call(task, stop)
    sink.end(result)
    return result


def _judge_due(report: MemberReport, ctx: MemberContext) -> bool:
    """A success with an output and no judged quality, and a judge to send it to (a
    backend that judges, the simulator, needs none)."""
    if ctx.judge is None or report.trace.status is not MemberStatus.SUCCEEDED:
        return False
    return report.trace.quality is None and report.output is not None


def _send_to_judge(task: MemberTask, report: MemberReport, ctx: MemberContext) -> None:
    """After the trace is appended (the judge needs the harvested row)."""
    if ctx.judge is None:
        return
    try:
        ctx.judge(task, report)
    except Exception:  # the member is done and reported: a lost judgement is only logged
        log.exception("member %s: the judge task could not be enqueued", task.member_id)


def _commit_once(
    task: MemberTask, backend: Backend, result: BackendResult, ctx: MemberContext
) -> BackendResult:
    """With an idempotency key, only the first successful member commits the effect."""
    if result.failure is not None or task.idempotency_key is None:
        return result
    ttl = ctx.settings.idempotency_ttl_s
    holder = ctx.store.claim_idempotency(task.idempotency_key, task.member_id, ttl)
    if holder != task.member_id:
        return BackendResult(
            FailureKind.IDEMPOTENCY_TAKEN,
            f"idempotency key {task.idempotency_key!r} already taken by {holder}",
            quality=result.quality,  # the output was judged: the trace keeps it for recompute
            tokens_in=result.tokens_in,
            tokens_out=result.tokens_out,
            proc_latency_s=result.proc_latency_s,
            link_observations=result.link_observations,
        )
    backend.commit(task)
    return result


def _cool_down(task: MemberTask, ttl_s: float, ctx: MemberContext) -> None:
    try:
        ctx.store.set_cooldown(task.candidate.id, ttl_s, ctx.clock() + ttl_s)
    except StoreError:  # the member's own report matters more than the cooldown
        log.warning("candidate %s: its cooldown could not be set", task.candidate.id)


def _reply(task: MemberTask, report: MemberReport, ctx: MemberContext) -> None:
    raw, ttl_s = report.model_dump_json(), ctx.settings.group_ttl_s
    if task.close is None:
        ctx.store.push_reply(task.group_id, raw, ttl_s)
        return
    # A staged group counts every report (coordinator.state.closing), this one too.
    s = ctx.settings
    limits = OutcomeLimits(s.profile_ttl_s, s.trace_stream_maxlen, s.trace_stream_ttl_s)
    outcome = MemberOutcome(task.group_id, raw, ttl_s, False, staged=True)
    ctx.store.report_member(outcome, ctx.profile_settings, limits)


def _won_close(task: MemberTask, report: MemberReport, now: float) -> GroupClose | None:
    """The group's close this report makes should it be the group's first (a staged
    close: coordinator.state.closing): a success's, decided now; None for a failure, or
    past the deadline, when the coordinator closes the group itself (and a report that
    late may outlive the group's keys, which would let it close the group again)."""
    if task.close is None or not report.trace.success or now > task.deadline_at_s:
        return None
    v = task.close.verdict
    decided = max(now, v.started_at_s)
    verdict = v.model_copy(update={"decided_at_s": decided, "latency_s": decided - v.started_at_s})
    c = task.close
    return GroupClose(task.group_id, c.signal, task.member_id, c.counts, verdict.model_dump_json())


def _report_and_harvest(
    task: MemberTask,
    measured: list[LinkObservation],
    report: MemberReport,
    ctx: MemberContext,
    ack: BrokerAck | None = None,
) -> None:
    """The reply and, when this worker owns the member's outcome, the one reading of the
    trace (with the link legs the backend measured) into the shared profiles, a success's
    latency into the hedge-delay window, and the trace itself: one atomic step, so the
    trace's stream id and the profile epoch it was counted in agree, which the periodic
    recompute relies on (coordinator.state.epochs)."""
    s, store = ctx.settings, ctx.store
    obs, legs = observations(report.trace, measured)
    latency = report.trace.latency_s
    success = obs is not None and obs.failure is None and ctx.delays is not None
    in_store = success and ctx.delays_in_store and store.records_delays
    src, dst = task.caller_zone, task.candidate.zone
    outcome = MemberOutcome(
        task.group_id, report.model_dump_json(), s.group_ttl_s, True,
        liveness.outcome_key(task.member_id), liveness.WORKER, task.candidate.id, obs,
        link_id(src, dst), src, dst, legs, task.candidate.role,
        latency if in_store else None, s.hedge_delay_window, ack, task.close is not None,
        _won_close(task, report, ctx.clock()), closed_token(task.rank),
    )  # fmt: skip
    limits = OutcomeLimits(s.profile_ttl_s, s.trace_stream_maxlen, s.trace_stream_ttl_s)
    recorded = store.report_member(outcome, ctx.profile_settings, limits)
    if recorded and success and not in_store and ctx.delays is not None:
        ctx.delays.record(task.candidate.role, latency)
