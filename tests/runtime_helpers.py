"""Test harness for the in-process runtime: a scripted backend implementing
workers.backends.base.Backend, a small pool of identical candidates, and the coordinator
wired to MemoryStore + ThreadDispatcher + MemoryBudget + MemoryDelayWindow."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from coordinator.config import HacoSettings
from coordinator.runtime.coordinator import Coordinator, InvocationResult
from coordinator.runtime.dispatch import ThreadDispatcher
from coordinator.runtime.pool import Pool
from coordinator.runtime.ports import RuntimeStore
from coordinator.state import keys
from coordinator.state.budget import MemoryBudget
from coordinator.state.cancelwatch import MemoryCancelWatcher
from coordinator.state.hedgedelay import MemoryDelayWindow
from coordinator.state.memstore import MemoryStore
from coordinator.state.store import RedisStore
from schemas.enums import FailureKind
from schemas.models import BackendSpec, Candidate, MemberReport, MemberTask, Message, RoleInvocation
from schemas.pool import PoolConfig
from workers.backends.base import Backend, BackendResult, StopCheck
from workers.member import MemberContext, execute_member

ROLE = "coder"
SLOW = 5.0  # a member that only ends when it is cancelled (every test ends far sooner)
AWAIT_CAP_S = 2.0  # a member awaiting events gives up after this (a failing test, no hang)
Event = tuple[str, str]  # (what, candidate id) as the scripted backend records it
RETURNED: Event = ("returned", "")


def trace_count(store: RuntimeStore) -> int:
    """Traces appended to the trace stream (Redis) or the in-memory store."""
    if isinstance(store, MemoryStore):
        return len(store.traces)
    assert isinstance(store, RedisStore)
    return int(store.r.xlen(keys.TRACES))


def started(*cids: str) -> tuple[Event, ...]:
    return tuple(("start", c) for c in cids)


@dataclass(frozen=True)
class Step:
    """A member's script: wait for the ``after`` events, then work ``duration_s``."""

    duration_s: float
    ok: bool = True
    quality: float = 0.8
    after: tuple[Event, ...] = ()


class ScriptedBackend:
    """A test backend (workers.backends.base.Backend): each candidate id has a scripted
    duration and outcome; it waits in 1 ms slices, checking the cancel flag between them.
    Orderings that matter are scripted with ``Step.after``, never left to thread timing."""

    def __init__(self, script: dict[str, Step]) -> None:
        self.script = script
        self._lock = threading.Lock()
        self._idle = threading.Event()  # never set: an interruptible sleep
        self.events: list[Event] = []  # in the order they happened
        self.enqueued: dict[str, float] = {}  # candidate id -> the coordinator's launch time
        self.stopped: set[str] = set()
        self.commits: list[str] = []  # member ids that performed the side effect

    def log(self, what: str, who: str = "") -> None:
        with self._lock:
            self.events.append((what, who))

    def before(self, first: Event, second: Event) -> bool:
        """Whether ``first`` was recorded and ``second`` was not, or only later."""
        with self._lock:
            if second not in self.events:
                return first in self.events
            return self.events.index(first) < self.events.index(second)

    def call(self, task: MemberTask, should_stop: StopCheck) -> BackendResult:
        cid, step = task.candidate.id, self.script[task.candidate.id]
        with self._lock:
            self.enqueued[cid] = task.enqueued_at_s
        self.log("start", cid)
        if not self._work(step, should_stop):
            with self._lock:
                self.stopped.add(cid)
            self.log("stopped", cid)
            return BackendResult(FailureKind.CANCELLED, "stopped by the cancel flag")
        self.log("finish", cid)
        if not step.ok:
            return BackendResult(FailureKind.INTERNAL, f"scripted failure of {cid}")
        return BackendResult(
            None, output=f"output of {cid}", quality=step.quality, proc_latency_s=step.duration_s
        )

    def _work(self, step: Step, should_stop: StopCheck) -> bool:
        """Live through the step in 1 ms slices; False when the cancel flag stopped it."""
        cap = time.monotonic() + AWAIT_CAP_S
        while not self._seen(step.after) and time.monotonic() < cap:
            if should_stop():
                return False
            self._idle.wait(0.001)
        end = time.monotonic() + step.duration_s
        while (left := end - time.monotonic()) > 0:
            if should_stop():
                return False
            self._idle.wait(min(left, 0.001))
        return True

    def _seen(self, events: tuple[Event, ...]) -> bool:
        with self._lock:
            return all(e in self.events for e in events)

    def commit(self, task: MemberTask) -> None:
        with self._lock:
            self.commits.append(task.member_id)


def small_pool(n: int = 3) -> Pool:
    """n identical cold candidates: the policy keeps pool order, so c<i> has rank i."""
    cands = [
        Candidate(
            id=f"c{i}", role=ROLE, model="scripted", zone="local", backend=BackendSpec(kind="http")
        )
        for i in range(n)
    ]
    return Pool(PoolConfig(caller_zone="local", zones=["local", "remote"], candidates=cands))


def invocation(**overrides: Any) -> RoleInvocation:
    return RoleInvocation(
        role=ROLE, payload=[Message(role="user", content="sort a list")], **overrides
    )


@dataclass
class Runtime:
    coordinator: Coordinator
    store: MemoryStore
    dispatcher: ThreadDispatcher
    budget: MemoryBudget
    backend: Any

    def invoke(self, **overrides: Any) -> InvocationResult:
        result = self.coordinator.invoke(invocation(**overrides))
        if isinstance(self.backend, ScriptedBackend):
            self.backend.log("returned")
        return result

    def reports(self) -> dict[int, MemberReport]:
        """Every member's own report so far, by rank, once those members have finished."""
        reports = [f.result(timeout=10.0) for f in list(self.dispatcher.futures)]
        return {r.trace.rank: r for r in reports}


def build_runtime(
    backend: Backend, pool: Pool | None = None, max_workers: int = 16, **overrides: Any
) -> Runtime:
    """The in-process runtime around ``backend``; the caller closes its dispatcher."""
    base: dict[str, Any] = {"default_deadline_s": 3.0, "cancel_poll_s": 0.002}
    settings = HacoSettings(**{**base, **overrides})
    store, delays, budget = MemoryStore(), MemoryDelayWindow(settings), MemoryBudget(settings)
    cancels = MemoryCancelWatcher(store.on_cancel, store.group_state)
    ctx = MemberContext(
        store=store, backends=lambda _t: backend, settings=settings, delays=delays, cancels=cancels
    )
    pool = pool or small_pool()
    dispatcher = ThreadDispatcher(lambda t: execute_member(t, ctx), pool.zones, max_workers)
    coord = Coordinator(pool, store, dispatcher, budget, delays, settings)
    return Runtime(coord, store, dispatcher, budget, backend)
