"""A staged close on the in-process runtime (HacoSettings.close_in_report): a group its
first report decides is closed by the winner's own report, and records exactly what its
coordinator's close would have. The workers' clock runs 1000 s ahead of the caller's
here, so a verdict says who made it: a worker's is decided 1000 s after its start.
Every test runs on Redis (member_report.lua) and on the in-memory store."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from runtime_helpers import RETURNED, ROLE, Runtime, ScriptedBackend, Step, invocation, small_pool
from test_liveness_inproc import DarkDispatcher, pool
from test_store import verdicts

from coordinator.config import HacoSettings
from coordinator.core.winner import Verdict
from coordinator.runtime.coordinator import Coordinator
from coordinator.runtime.dispatch import ThreadDispatcher
from coordinator.runtime.pool import Pool
from coordinator.runtime.ports import RuntimeStore
from coordinator.state.budget import MemoryBudget
from coordinator.state.cancelwatch import MemoryCancelWatcher
from coordinator.state.hedgedelay import MemoryDelayWindow
from coordinator.state.memstore import MemoryStore
from coordinator.state.opening import GroupOpening
from coordinator.state.store import RedisStore
from schemas.enums import GroupState, MemberStatus, WinnerMode
from schemas.models import GroupVerdict, MemberTask
from workers.member import MemberContext, execute_member

AHEAD_S = 1000.0  # the workers' clock, ahead of the caller's
OWN = {"group_id", "started_at_s", "decided_at_s", "latency_s"}  # each call's own


class HeldDispatcher:
    """A dispatcher whose messages wait in a list for the test to run them."""

    def __init__(self) -> None:
        self.tasks: list[MemberTask] = []

    def send(self, zone: str, task: MemberTask) -> None:
        self.tasks.append(task)

    def send_many(self, sends: list[tuple[str, MemberTask]], opening: GroupOpening | None) -> None:
        if opening is not None:
            opening.open()
        self.tasks.extend(task for _, task in sends)


def worker_clock() -> float:
    return time.time() + AHEAD_S


Stores = Callable[[], RuntimeStore]


@pytest.fixture(params=["redis", "memory"])
def stores(request: pytest.FixtureRequest) -> Stores:
    if request.param == "redis":
        r = request.getfixturevalue("redis_db")

        def fresh() -> RuntimeStore:
            r.flushdb()  # each runtime plans on a cold pool, as a new MemoryStore's
            return RedisStore(r)

        return fresh
    return MemoryStore


def build(new_store: Stores, backend: ScriptedBackend, pool_: Pool, **overrides: Any) -> Runtime:
    # The deadline is past the workers' lead, so they start what they are given.
    base = {"default_deadline_s": 2 * AHEAD_S, "cancel_poll_s": 0.002}
    settings = HacoSettings(**{**base, **overrides})
    store, delays, budget = new_store(), MemoryDelayWindow(settings), MemoryBudget(settings)
    cancels = None  # members poll their group's state
    if isinstance(store, MemoryStore):
        cancels = MemoryCancelWatcher(store.on_cancel, store.group_state)
    ctx = MemberContext(
        store=store, backends=lambda _t: backend, settings=settings, delays=delays,
        cancels=cancels, clock=worker_clock,
    )  # fmt: skip
    dispatcher = ThreadDispatcher(lambda t: execute_member(t, ctx), pool_.zones, 16)
    coord = Coordinator(pool_, store, dispatcher, budget, delays, settings)
    return Runtime(coord, store, dispatcher, budget, backend)  # type: ignore[arg-type]


@dataclass
class Runtimes:
    new_store: Stores
    made: list[Runtime] = field(default_factory=list)

    def build(self, backend: ScriptedBackend, pool_: Pool, **overrides: Any) -> Runtime:
        for rt in self.made:  # their members finish before a fresh store is made
            rt.dispatcher.close()
        self.made.append(build(self.new_store, backend, pool_, **overrides))
        return self.made[-1]


@pytest.fixture
def runtimes(stores: Stores) -> Iterator[Runtimes]:
    rts = Runtimes(stores)
    yield rts
    for rt in rts.made:
        rt.coordinator.close()
        rt.dispatcher.close()


def verdict(store: RuntimeStore, group_id: str) -> GroupVerdict:
    """The group's one verdict record."""
    found = [GroupVerdict.model_validate_json(raw) for raw in verdicts(store)]
    (v,) = [v for v in found if v.group_id == group_id]
    return v


def run(
    rts: Runtimes,
    steps: list[Step],
    staged: bool,
    settings: dict[str, Any] | None = None,
    **call: Any,
) -> tuple[GroupVerdict, dict[str, int]]:
    """One call on a fresh runtime: its verdict, whose winner is the one returned, and
    the counters its close added."""
    backend = ScriptedBackend({f"c{i}": s for i, s in enumerate(steps)})
    rt = rts.build(backend, small_pool(len(steps)), close_in_report=staged, **(settings or {}))
    before = rt.store.metrics()
    result = rt.invoke(**call)
    v = verdict(rt.store, result.group_id)
    assert (v.winner_member, v.p_success) == (result.winner_id, result.p_success)
    after = rt.store.metrics()
    return v, {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}


def by_worker(v: GroupVerdict) -> bool:
    return v.decided_at_s - v.started_at_s > AHEAD_S / 2


def assert_same_record(a: GroupVerdict, b: GroupVerdict) -> None:
    """Equal but for what is each call's own (the winner by its rank)."""

    def fields(v: GroupVerdict) -> dict[str, Any]:
        winner = v.winner_member and v.winner_member.removeprefix(v.group_id)
        return {**v.model_dump(exclude=OWN), "winner_member": winner}

    assert fields(a) == fields(b)


def test_a_one_member_group_is_closed_by_its_report(runtimes: Runtimes) -> None:
    staged, counted = run(runtimes, [Step(0.005)], True)
    assert by_worker(staged)
    assert staged.latency_s == pytest.approx(staged.decided_at_s - staged.started_at_s)
    own, own_counted = run(runtimes, [Step(0.005)], False)
    assert not by_worker(own)
    assert_same_record(staged, own)
    assert (staged.state, staged.launched, staged.succeeded) == (GroupState.WON, 1, 1)
    assert staged.winner_rule is WinnerMode.RANKED
    assert counted == own_counted and counted["invocations"] == 1  # the same, counted once


@pytest.mark.parametrize("cancel", [True, False])
def test_first_mode_is_closed_by_the_first_success(runtimes: Runtimes, cancel: bool) -> None:
    # c1 wins; the others only end once the call has returned (or are cancelled).
    steps = [Step(0.005, after=(RETURNED,)), Step(0.005), Step(0.005, after=(RETURNED,))]
    settings = {"cancel_losers": cancel}
    staged, counted = run(runtimes, steps, True, settings, winner_mode="first")
    own, own_counted = run(runtimes, steps, False, settings, winner_mode="first")
    assert by_worker(staged) and not by_worker(own)
    assert_same_record(staged, own)
    assert counted == own_counted
    others = (staged.cancelled, staged.running)
    assert staged.succeeded == 1 and others == ((2, 0) if cancel else (0, 2))


def test_ranked_rank_one_leaves_the_close_to_the_coordinator(runtimes: Runtimes) -> None:
    # Rank 1 succeeds first, but ranked waits for rank 0's failure: the coordinator closes.
    steps = [Step(0.005, ok=False, after=(("finish", "c1"),)), Step(0.005)]
    v, _ = run(runtimes, steps, True)
    assert not by_worker(v)
    assert (v.winner_member, v.succeeded, v.failed) == (f"{v.group_id}.1", 1, 1)


def test_a_failure_first_leaves_the_close_to_the_coordinator(runtimes: Runtimes) -> None:
    steps = [Step(0.005, ok=False), Step(0.005, after=(("finish", "c0"),))]
    v, _ = run(runtimes, steps, True, winner_mode="first")
    assert not by_worker(v)
    assert (v.succeeded, v.failed) == (1, 1)


def test_a_member_given_up_is_counted_by_the_coordinators_close(runtimes: Runtimes) -> None:
    """c0's zone is dark: it is given up at its start timeout, before c1's success, the
    group's first report, which would otherwise have closed it counting c0 as kept."""
    backend = ScriptedBackend({"c0": Step(0.005), "c1": Step(0.3)})
    rt = runtimes.build(backend, pool(["remote", "local"]), start_timeout_min_s=0.05)
    dispatcher = DarkDispatcher(rt.dispatcher, {"remote"})
    rt.coordinator.dispatcher = dispatcher
    try:
        result = rt.invoke(winner_mode="first")
    finally:
        dispatcher.light()
        dispatcher.close()
    assert result.members[0].status is MemberStatus.TIMED_OUT
    v = verdict(rt.store, result.group_id)
    assert not by_worker(v)
    assert (v.succeeded, v.timed_out, v.running) == (1, 1, 0)


def test_a_close_made_by_the_winners_report_is_adopted(runtimes: Runtimes) -> None:
    """The caller decided otherwise (here: all failed, as at a give-up) just as the
    winner's report closed the group: that close holds, and the caller returns its win."""
    backend = ScriptedBackend({"c0": Step(0.001)})
    rt = runtimes.build(backend, small_pool(1))
    held = HeldDispatcher()
    coord = rt.coordinator
    coord.dispatcher = held
    g = coord._plan(invocation())
    coord._launch_initial(g)
    (task,) = held.tasks
    ctx = MemberContext(
        store=rt.store, backends=lambda _t: backend, settings=coord.settings, clock=worker_clock
    )
    assert execute_member(task, ctx).trace.success  # its report closed the group
    result = coord._finish(g, Verdict(True, None))
    assert (result.state, result.winner_id) == (GroupState.WON, task.member_id)
    assert by_worker(verdict(rt.store, result.group_id))
    assert result.role == ROLE
