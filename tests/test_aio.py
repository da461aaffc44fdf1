"""The async core (coordinator.runtime.aio): invocations awaited on one event loop share the
reply hub's few Redis connections. Members run in-process (ThreadDispatcher, the workers'
execute_member) but report through Redis, as a worker does, so the hub pops real reply lists."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis
from runtime_helpers import ScriptedBackend, Step, invocation, small_pool

from coordinator.config import HacoSettings
from coordinator.errors import AllFailedError
from coordinator.runtime.aio import ReplyHub, ainvoke, shielded
from coordinator.runtime.coordinator import Coordinator
from coordinator.runtime.dispatch import ThreadDispatcher
from coordinator.runtime.results import InvocationResult
from coordinator.state.budget import MemoryBudget
from coordinator.state.hedgedelay import MemoryDelayWindow
from coordinator.state.store import RedisStore
from schemas.enums import GroupState, WinnerMode
from workers.member import MemberContext, execute_member

SETTINGS = HacoSettings(
    default_deadline_s=30.0,
    cancel_poll_s=0.002,
    start_timeout_min_s=30.0,  # a busy in-process dispatcher is no dark zone
    hub_shards=2,
    hub_idle_s=0.2,
)


@dataclass
class AsyncRuntime:
    coordinator: Coordinator
    dispatcher: ThreadDispatcher
    url: str


def build(redis_db: redis.Redis, url: str, script: dict[str, Step], **over: object) -> AsyncRuntime:
    settings = SETTINGS.model_copy(update=over)
    store = RedisStore(redis_db)
    delays, budget = MemoryDelayWindow(settings), MemoryBudget(settings)
    backend = ScriptedBackend(script)
    ctx = MemberContext(
        store=store, backends=lambda _t: backend, settings=settings, delays=delays, cancels=None
    )
    pool = small_pool()
    dispatcher = ThreadDispatcher(lambda t: execute_member(t, ctx), pool.zones, 64)
    coord = Coordinator(pool, store, dispatcher, budget, delays, settings)
    return AsyncRuntime(coord, dispatcher, url)


@pytest.fixture
def fast(redis_db: redis.Redis, redis_url: str) -> Iterator[AsyncRuntime]:
    rt = build(redis_db, redis_url, {c: Step(0.005) for c in ("c0", "c1", "c2")})
    yield rt
    rt.dispatcher.close()
    rt.coordinator.close()  # no lost-member record fires into a later test


def hub_connections(r: redis.Redis, hub: ReplyHub) -> int:
    return sum(1 for c in r.client_list() if c.get("name", "").startswith(f"haco-hub-{hub.id}"))


async def run_many(rt: AsyncRuntime, n: int, r: redis.Redis) -> tuple[list[object], int]:
    hub = ReplyHub(rt.url, rt.coordinator.settings)
    try:
        results = await asyncio.gather(
            *(ainvoke(rt.coordinator, hub, invocation()) for _ in range(n)), return_exceptions=True
        )
        assert hub.waiting == 0
        return list(results), hub_connections(r, hub)
    finally:
        await hub.aclose()


def test_one_invocation_awaits_its_winner(fast: AsyncRuntime, redis_db: redis.Redis) -> None:
    (result,), _ = asyncio.run(run_many(fast, 1, redis_db))
    assert not isinstance(result, BaseException)
    assert result.state is GroupState.WON and result.candidate_id == "c0"  # type: ignore[attr-defined]


def test_many_invocations_share_the_hubs_connections(
    fast: AsyncRuntime, redis_db: redis.Redis
) -> None:
    results, connections = asyncio.run(run_many(fast, 300, redis_db))
    errors = [r for r in results if isinstance(r, BaseException)]
    assert errors == []
    # (members fold into the shared profiles as they finish, so the ranking moves)
    assert {r.state for r in results} == {GroupState.WON}  # type: ignore[attr-defined]
    assert len({r.group_id for r in results}) == 300  # type: ignore[attr-defined]
    # shards plus the control-token pool, however many waited
    assert 0 < connections <= SETTINGS.hub_shards + 2


def test_all_failed_raises_with_every_reason(redis_db: redis.Redis, redis_url: str) -> None:
    rt = build(redis_db, redis_url, {c: Step(0.005, ok=False) for c in ("c0", "c1", "c2")})
    try:
        (err,), _ = asyncio.run(run_many(rt, 1, redis_db))
    finally:
        rt.dispatcher.close()
        rt.coordinator.close()  # no lost-member record fires into a later test
    assert isinstance(err, AllFailedError)
    assert len(err.failures) == 3
    assert all("scripted failure" in why for why in err.failures.values())


def test_staggered_backup_is_launched_by_the_awaits_timer(
    redis_db: redis.Redis, redis_url: str
) -> None:
    script = {"c0": Step(2.0), "c1": Step(0.005), "c2": Step(0.005)}
    rt = build(redis_db, redis_url, script, cancel_losers=True, initial_hedge_delay_s=0.05)

    async def one() -> object:
        hub = ReplyHub(redis_url, rt.coordinator.settings)
        try:
            return await ainvoke(
                rt.coordinator, hub, invocation(launch_mode="staggered", winner_mode="first")
            )
        finally:
            await hub.aclose()

    try:
        result = asyncio.run(one())
    finally:
        rt.dispatcher.close()
        rt.coordinator.close()  # no lost-member record fires into a later test
    assert result.candidate_id == "c1" and result.backups >= 1  # type: ignore[attr-defined]


def test_best_decides_on_the_backends_judged_outputs(fast: AsyncRuntime) -> None:
    async def one() -> InvocationResult:
        hub = ReplyHub(fast.url, fast.coordinator.settings)
        try:
            return await ainvoke(fast.coordinator, hub, invocation(winner_mode="best"))
        finally:
            await hub.aclose()

    result = asyncio.run(one())
    assert result.state is GroupState.WON
    # the scripted backend judges its outputs: best needs no judge wait, no fallback
    assert result.winner_rule is WinnerMode.BEST and result.fallback_reason is None
    assert result.quality == 0.8


def test_a_cancelled_caller_leaves_the_group_to_close(
    redis_db: redis.Redis, redis_url: str
) -> None:
    rt = build(redis_db, redis_url, {c: Step(0.3) for c in ("c0", "c1", "c2")})

    async def go() -> None:
        hub = ReplyHub(redis_url, rt.coordinator.settings)
        try:
            task = asyncio.ensure_future(shielded(ainvoke(rt.coordinator, hub, invocation())))
            while hub.waiting == 0:
                await asyncio.sleep(0.005)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            while hub.waiting:  # the group still runs to its close
                await asyncio.sleep(0.01)
        finally:
            await hub.aclose()

    try:
        asyncio.run(go())
    finally:
        rt.dispatcher.close()
        rt.coordinator.close()  # no lost-member record fires into a later test
    assert len(list(redis_db.scan_iter("haco:g:*:winner"))) == 1
