"""Cancellation through the per-process cancel watcher (coordinator.state.cancelwatch):
delivered to running members on Redis (PUBLISH/SUBSCRIBE) and in memory, nothing missed
when the cancel came while the watcher was not subscribed (the re-validation), a member
of a cancelled group never starts, and a member's Redis commands do not grow with the
length of its call."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from polling import wait_for
from runtime_helpers import ROLE, SLOW, ScriptedBackend, Step, trace_count

from coordinator.config import HacoSettings
from coordinator.runtime import liveness
from coordinator.runtime.pool import sim_scenario
from coordinator.runtime.ports import RuntimeStore
from coordinator.state import keys
from coordinator.state.cancelwatch import CancelWatcher, MemoryCancelWatcher, RedisCancelWatcher
from coordinator.state.closing import CloseLimits, GroupClose
from coordinator.state.memstore import MemoryStore
from coordinator.state.store import RedisStore
from schemas.enums import FailureKind, GroupSignal, MemberStatus
from schemas.models import BackendSpec, Candidate, MemberReport, MemberTask, Message
from schemas.pool import SimSection
from workers.backends.simulated import SimBackend
from workers.member import MemberContext, begin_member, execute_member, run_begun

TTL = 60.0
IDLE_S, RETRY_S = 0.05, 0.05  # the test watcher notices close and reconnects quickly
LIMITS = CloseLimits(TTL, TTL, 1000, TTL)


@dataclass
class Setup:
    store: RuntimeStore
    watcher: CancelWatcher


@pytest.fixture(params=["redis", "memory"])
def setup(request: pytest.FixtureRequest) -> Iterator[Setup]:
    if request.param == "memory":
        mem = MemoryStore()
        yield Setup(mem, MemoryCancelWatcher(mem.on_cancel, mem.group_state))
        return
    r: redis.Redis = request.getfixturevalue("redis_db")
    watcher = RedisCancelWatcher(r, IDLE_S, RETRY_S)
    try:
        yield Setup(RedisStore(r), watcher)
    finally:
        watcher.close()


def task_for(group_id: str, cid: str = "c0") -> MemberTask:
    cand = Candidate(
        id=cid, role=ROLE, model="scripted", zone="local", backend=BackendSpec(kind="http")
    )
    now = time.time()
    return MemberTask(
        group_id=group_id,
        member_id=f"{group_id}.0",
        rank=0,
        candidate=cand,
        caller_zone="local",
        payload=[Message(role="user", content="hi")],
        deadline_at_s=now + 30.0,
        enqueued_at_s=now,
    )


def context(store: RuntimeStore, backend: Any, watcher: CancelWatcher | None) -> MemberContext:
    settings = HacoSettings(cancel_poll_s=0.002)
    return MemberContext(
        store=store, backends=lambda _t: backend, settings=settings, cancels=watcher
    )


def close(signal: GroupSignal, group_id: str) -> GroupClose:
    return GroupClose(group_id, signal, None, {"invocations": 1}, "{}")


# ---------------------------------------------------------------- delivery


@pytest.mark.parametrize("how", ["set_group_state", "close_group"])
def test_a_cancel_reaches_the_watch_of_a_running_member(setup: Setup, how: str) -> None:
    store, watcher = setup.store, setup.watcher
    store.open_group("g", TTL)
    other = watcher.watch("other")
    with watcher.watch("g") as stop:
        if isinstance(watcher, RedisCancelWatcher):
            assert watcher.wait_subscribed(10.0)
        if how == "close_group":
            store.close_group(close(GroupSignal.CANCELLED, "g"), LIMITS)
        else:
            store.set_group_state("g", GroupSignal.CANCELLED, TTL)
        assert stop.wait(10.0)  # woken by the cancel, not by the timeout
    assert not other()  # another group's member runs on
    other.close()
    assert watcher.running_groups() == []


def test_a_resolved_group_does_not_stop_its_members(setup: Setup) -> None:
    store, watcher = setup.store, setup.watcher
    store.open_group("g", TTL)
    with watcher.watch("g") as stop, watcher.watch("marker") as marker:
        if isinstance(watcher, RedisCancelWatcher):
            assert watcher.wait_subscribed(10.0)
        store.close_group(close(GroupSignal.RESOLVED, "g"), LIMITS)
        store.set_group_state("marker", GroupSignal.CANCELLED, TTL)
        assert marker.wait(10.0)  # delivered in order: anything about g came before
        assert not stop()


def cancelled_while_running(setup: Setup, task: MemberTask) -> MemberReport:
    """``task`` run on a backend that only ends when cancelled; its group cancelled once
    it runs and its deadline (when it is near) has passed."""
    backend = ScriptedBackend({"c0": Step(SLOW)})
    setup.store.open_group("g", TTL)
    with ThreadPoolExecutor(1) as pool:
        ctx = context(setup.store, backend, setup.watcher)
        running = pool.submit(execute_member, task, ctx)
        wait_for("the member to start", lambda: ("start", "c0") in backend.events)
        if task.deadline_at_s < time.time() + 1.0:
            wait_for("its deadline to pass", lambda: time.time() > task.deadline_at_s + 0.01)
        setup.store.set_group_state("g", GroupSignal.CANCELLED, TTL)
        return running.result(timeout=30.0)


def test_a_running_member_is_stopped_by_its_watcher(setup: Setup) -> None:
    """A loser cancelled before its deadline reports its own outcome (and claims it)."""
    report = cancelled_while_running(setup, task_for("g"))
    assert report.trace.status is MemberStatus.CANCELLED
    assert report.trace.failure_reason == "stopped by the cancel flag"
    assert setup.watcher.running_groups() == []
    assert trace_count(setup.store) == 1
    claim = setup.store.claim_idempotency(liveness.outcome_key("g.0"), "coordinator", TTL)
    assert claim == liveness.WORKER


def test_a_simulated_call_is_woken_by_the_cancel(setup: Setup) -> None:
    """The simulated backend waits on the watch itself: a cancel ends its sleep at once."""
    store, watcher = setup.store, setup.watcher
    sim = SimBackend(sim_scenario(SimSection(scenario="overall")), time_scale=100.0, poll_s=10.0)
    store.open_group("g", TTL)
    cand = task_for("g").candidate
    sim_cand = cand.model_copy(
        update={"backend": BackendSpec(kind="sim", settings={"candidate": "planner-local-1"})}
    )
    task = task_for("g").model_copy(update={"sim_seed": 3, "candidate": sim_cand})
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(execute_member, task, context(store, sim, watcher))
        wait_for("the member to register", lambda: watcher.running_groups() == ["g"])
        store.set_group_state("g", GroupSignal.CANCELLED, TTL)
        report = running.result(timeout=30.0)  # a 10 s slice or a 100× call: never reached
    assert report.trace.failure_kind is FailureKind.CANCELLED


def test_a_member_of_a_cancelled_group_never_starts(setup: Setup) -> None:
    store, watcher = setup.store, setup.watcher
    backend = ScriptedBackend({"c0": Step(0.001)})
    store.open_group("g", TTL)
    store.set_group_state("g", GroupSignal.CANCELLED, TTL)  # published before it registered
    report = execute_member(task_for("g"), context(store, backend, watcher))
    assert (report.trace.status, report.trace.failure_reason) == (
        MemberStatus.CANCELLED,
        "group cancelled",
    )
    assert backend.events == []
    assert watcher.running_groups() == []


@pytest.mark.parametrize("signal", [GroupSignal.OPEN, GroupSignal.CANCELLED])
def test_a_member_begun_without_its_start_makes_it_in_its_run(
    setup: Setup, signal: GroupSignal
) -> None:
    """A member the lane took with another one is begun in its own thread (its watch
    registered first) and its run makes the start: it runs in an open group, never in a
    cancelled one, and its start claim is its worker's either way it ran."""
    store, watcher = setup.store, setup.watcher
    backend = ScriptedBackend({"c0": Step(0.001)})
    store.open_group("g", TTL)
    store.set_group_state("g", signal, TTL)
    ctx = context(store, backend, watcher)
    begun = begin_member(task_for("g"), ctx)
    assert not begun.made and watcher.running_groups() == ["g"]
    report = run_begun(begun, ctx)
    assert watcher.running_groups() == []
    if signal is GroupSignal.CANCELLED:
        assert report.trace.failure_reason == "group cancelled" and backend.events == []
        return
    assert report.trace.status is MemberStatus.SUCCEEDED and backend.events
    assert store.claim_idempotency(liveness.start_key("g.0"), "other", TTL) == liveness.WORKER


def test_a_member_stopped_past_its_deadline_leaves_its_outcome_to_the_coordinator(
    setup: Setup,
) -> None:
    """Its coordinator's deadline close cancelled it and records it lost (a hang), so the
    member replies and claims nothing: no trace of its own, the outcome's claim free."""
    task = task_for("g").model_copy(update={"deadline_at_s": time.time() + 0.05})
    report = cancelled_while_running(setup, task)
    assert report.trace.status is MemberStatus.CANCELLED
    assert setup.store.pop_reply("g", 0.0) is not None  # its reply went back
    assert trace_count(setup.store) == 0
    claim = setup.store.claim_idempotency(liveness.outcome_key("g.0"), "coordinator", TTL)
    assert claim == "coordinator"


# ---------------------------------------------------------------- nothing missed (Redis)


def silently_cancel(r: redis.Redis, group_id: str) -> None:
    """The cancel whose PUBLISH the watcher did not hear: only re-validation can see it."""
    r.set(keys.group_state(group_id), GroupSignal.CANCELLED.value, px=int(TTL * 1000))


def test_a_cancel_before_the_watcher_subscribed_is_not_missed(redis_db: redis.Redis) -> None:
    RedisStore(redis_db).open_group("g", TTL)
    watcher = RedisCancelWatcher(redis_db, IDLE_S, RETRY_S)
    try:
        silently_cancel(redis_db, "g")
        stop = watcher.watch("g")  # registers, then starts the watcher: subscribe, MGET
        assert watcher.wait_subscribed(10.0)
        assert stop() and watcher.revalidations == 1
    finally:
        watcher.close()


def test_a_cancel_during_a_reconnect_is_not_missed(redis_db: redis.Redis) -> None:
    RedisStore(redis_db).open_group("g", TTL)
    watcher = RedisCancelWatcher(redis_db, IDLE_S, RETRY_S)
    try:
        stop = watcher.watch("g")
        assert watcher.wait_subscribed(10.0) and not stop()
        silently_cancel(redis_db, "g")  # lost, as if published while disconnected
        clients: list[dict[str, Any]] = redis_db.client_list()  # type: ignore[assignment]
        ids = [c["id"] for c in clients if c.get("name") == watcher.name]
        assert len(ids) == 1  # the watcher's one SUBSCRIBE connection
        redis_db.client_kill_filter(_id=ids[0])
        assert stop.wait(30.0)  # the re-validation after resubscribing found it
        assert watcher.subscriptions >= 2
    finally:
        watcher.close()


def test_the_watcher_thread_ends_on_close(redis_db: redis.Redis) -> None:
    watcher = RedisCancelWatcher(redis_db, IDLE_S, RETRY_S)
    watcher.watch("g").close()
    assert watcher.wait_subscribed(10.0)
    watcher.close()
    assert not any(t.name == watcher.name for t in threading.enumerate())


# ---------------------------------------------------------------- O(1) per member


class CountingConnection(redis.Connection):
    """Counts the commands sent on it (single commands, and each of a pipeline's)."""

    counted = 0
    guard = threading.Lock()

    def send_command(self, *args: Any, **kwargs: Any) -> None:
        with CountingConnection.guard:
            CountingConnection.counted += 1
        super().send_command(*args, **kwargs)

    def pack_commands(self, commands: Any) -> Any:
        commands = list(commands)
        with CountingConnection.guard:
            CountingConnection.counted += len(commands)
        return super().pack_commands(commands)


def member_commands(
    r: redis.Redis, group_id: str, step: Step, watcher: CancelWatcher | None
) -> int:
    store = RedisStore(r)
    store.open_group(group_id, TTL)
    backend = ScriptedBackend({"c0": step})
    before = CountingConnection.counted
    report = execute_member(task_for(group_id), context(store, backend, watcher))
    assert report.trace.status is MemberStatus.SUCCEEDED
    return CountingConnection.counted - before


def test_a_members_redis_commands_do_not_grow_with_its_call(
    redis_url: str, redis_db: redis.Redis
) -> None:
    pool = redis.ConnectionPool.from_url(redis_url, connection_class=CountingConnection)
    r = redis.Redis(connection_pool=pool)
    watcher = RedisCancelWatcher(r, IDLE_S, RETRY_S)
    try:
        watcher.watch("warm-up").close()
        assert watcher.wait_subscribed(10.0)  # the watcher's own commands come before
        member_commands(r, "warm", Step(0.001), watcher)  # scripts loaded, epoch read once
        # Both past the start-notice delay (20 ms): each sends its start token once.
        short = member_commands(r, "short", Step(0.05), watcher)
        long = member_commands(r, "long", Step(0.3), watcher)
        polled_short = member_commands(r, "p-short", Step(0.05), None)
        polled_long = member_commands(r, "p-long", Step(0.3), None)
    finally:
        watcher.close()
        r.close()
        pool.disconnect()
    assert long == short  # O(1): one state read at the start, then the reports
    assert polled_long > polled_short  # the polling it replaces: one read per check
