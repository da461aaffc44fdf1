"""The async core: many invocations in flight in one process, no thread and no Redis
connection per waiting invocation.

    hub = ReplyHub(redis_url, settings)          # one per event loop (see Hubs)
    result = await ainvoke(coordinator, hub, invocation)

:class:`ReplyHub` splits the process's waiting groups over ``hub_shards`` shards. Each
shard owns one dedicated Redis connection blocked in one ``BRPOP`` on its control list
(keys.hub_control) and on the reply lists (keys.group_replies) of its groups; a popped
entry goes to that group's :class:`asyncio.Queue`. A group registered while its shard is
blocked gets in with one control token, which makes the shard re-issue its BRPOP with the
new key set (at most one token per issue). Entries wait in their lists until popped, so
nothing sent before a (re-)issue is lost; an entry of a group no longer waited for (a
late duplicate) is dropped, as the sync path would leave it to expire.

:func:`ainvoke` runs the coordinator's own steps (:class:`coordinator.runtime.coordinator.
Coordinator`: planning, launches, ``_tick`` with the winner rule, stagger launcher and
patience, the close) and awaits the group's queue instead of a blocking pop; launch and
patience timers are the await's timeout, so no wake token is pushed. Planning, sends and
the close are short synchronous Redis and broker calls made on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
import weakref
import zlib
from collections.abc import Coroutine
from typing import Any

import redis
import redis.asyncio as aioredis

from coordinator.config import HacoSettings
from coordinator.core.judged import decide_best
from coordinator.core.winner import Verdict
from coordinator.errors import StoreError
from coordinator.runtime import judging
from coordinator.runtime.coordinator import WAKE, Coordinator
from coordinator.runtime.group import Group
from coordinator.runtime.results import InvocationResult
from coordinator.state import keys
from coordinator.state.codec import text
from schemas.enums import WinnerMode
from schemas.models import RoleInvocation

log = logging.getLogger(__name__)

Replies = asyncio.Queue[str]
_WAKE_PUSH_CONNECTIONS = 2  # the hub's command connections (control tokens only)


class _Shard:
    def __init__(self, hub: ReplyHub, index: int) -> None:
        self.hub = hub
        self.ctl = keys.hub_control(hub.id, index)
        self.queues: dict[str, list[Replies]] = {}  # list key -> its waiters' queues
        self.restore: set[str] = set()  # done lists: a popped token is pushed back
        self.conn = aioredis.Redis.from_url(
            hub.url, single_connection_client=True, client_name=f"haco-hub-{hub.id}-{index}"
        )
        self.issued: frozenset[str] = frozenset()  # the lists of the BRPOP in progress
        self.woken = False  # a control token is on its way for the BRPOP in progress
        self.task: asyncio.Task[None] | None = None

    async def add(self, key: str, restore: bool = False) -> Replies:
        queue: Replies = asyncio.Queue()
        self.queues.setdefault(key, []).append(queue)
        if restore:
            self.restore.add(key)
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._run())
        elif key not in self.issued and not self.woken:
            self.woken = True
            await self.hub.wake(self.ctl)
        return queue

    def remove(self, key: str, queue: Replies | None = None) -> None:
        """Stop delivering ``key``'s entries to ``queue`` (None: to every waiter)."""
        left = [q for q in self.queues.get(key, []) if queue is not None and q is not queue]
        if left:
            self.queues[key] = left
        else:
            self.queues.pop(key, None)
            self.restore.discard(key)

    async def _run(self) -> None:
        while not self.hub.closed:
            try:
                await self._once()
            except (redis.RedisError, OSError) as exc:
                log.warning("reply hub shard %s: %s; retrying", self.ctl, exc)
                await asyncio.sleep(self.hub.settings.hub_retry_s)

    async def _once(self) -> None:
        names = list(self.queues)
        self.issued, self.woken = frozenset(names), False
        got = await self.conn.brpop([self.ctl, *names], timeout=self.hub.settings.hub_idle_s)
        if got is None:
            return
        key, value = text(got[0]), text(got[1])
        if key in self.restore:  # a done token stays for every other waiter, anywhere
            await self.hub.push_back(key, value)
        for queue in self.queues.get(key, []):
            queue.put_nowait(value)

    async def aclose(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await self.conn.aclose()


class ReplyHub:
    """One process's (one event loop's) listener on the reply lists of its groups:
    ``hub_shards`` blocking connections plus two for control tokens, however many wait."""

    def __init__(self, url: str, settings: HacoSettings) -> None:
        self.url = url
        self.settings = settings
        self.id = uuid.uuid4().hex[:16]
        self.closed = False
        self._pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=_WAKE_PUSH_CONNECTIONS, client_name=f"haco-hub-{self.id}-ctl"
        )
        self._cmd = aioredis.Redis(connection_pool=self._pool)
        self._shards = [_Shard(self, i) for i in range(settings.hub_shards)]

    def _shard(self, group_id: str) -> _Shard:
        return self._shards[zlib.crc32(group_id.encode()) % len(self._shards)]

    async def register(self, group_id: str) -> Replies:
        """The queue the group's reply entries arrive on, until :meth:`unregister`."""
        if self.closed:
            raise StoreError(f"the reply hub is closed; group {group_id!r} cannot wait on it")
        return await self._shard(group_id).add(keys.group_replies(group_id))

    def unregister(self, group_id: str) -> None:
        self._shard(group_id).remove(keys.group_replies(group_id))

    async def wait_done(self, group_id: str, timeout_s: float) -> bool:
        """Whether a submitted invocation's done token (keys.invocation_done) shows up
        within ``timeout_s``; the token is pushed back, so it stays for other waiters."""
        if self.closed:
            raise StoreError(f"the reply hub is closed; invocation {group_id!r} cannot wait")
        shard, key = self._shard(group_id), keys.invocation_done(group_id)
        queue = await shard.add(key, restore=True)
        try:
            return await _next(queue, timeout_s) is not None
        finally:
            shard.remove(key, queue)

    @property
    def waiting(self) -> int:
        return sum(len(s.queues) for s in self._shards)

    async def wake(self, ctl: str) -> None:
        try:
            pipe = self._cmd.pipeline(transaction=False)
            pipe.lpush(ctl, "1")
            pipe.pexpire(ctl, int(self.settings.group_ttl_s * 1000))
            await pipe.execute()
        except redis.RedisError as exc:  # the shard re-issues by hub_idle_s anyway
            log.warning("reply hub: no control token for %s: %s", ctl, exc)

    async def push_back(self, key: str, token: str) -> None:
        try:
            pipe = self._cmd.pipeline(transaction=True)
            pipe.lpush(key, token)
            pipe.pexpire(key, int(self.settings.result_ttl_s * 1000))
            await pipe.execute()
        except redis.RedisError as exc:  # its waiters re-check the result by its key
            log.warning("reply hub: done token %s not pushed back: %s", key, exc)

    async def aclose(self) -> None:
        self.closed = True
        for shard in self._shards:
            await shard.aclose()
        await self._cmd.aclose()
        await self._pool.disconnect()


class Hubs:
    """A HacoClient's hubs: one per event loop it is awaited from (a hub's connections
    and tasks belong to one loop)."""

    def __init__(self, url: str, settings: HacoSettings) -> None:
        self.url = url
        self.settings = settings
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ReplyHub] = (
            weakref.WeakKeyDictionary()
        )

    def current(self) -> ReplyHub:
        loop = asyncio.get_running_loop()
        hub = self._by_loop.get(loop)
        if hub is None or hub.closed:
            hub = self._by_loop[loop] = ReplyHub(self.url, self.settings)
        return hub

    async def aclose(self) -> None:
        """Close the running loop's hub (others close with their loops)."""
        hub = self._by_loop.pop(asyncio.get_running_loop(), None)
        if hub is not None:
            await hub.aclose()


async def _next(queue: Replies, timeout_s: float) -> str | None:
    if not queue.empty():
        return queue.get_nowait()
    if timeout_s <= 0:
        return None
    try:
        return await asyncio.wait_for(queue.get(), timeout_s)
    except TimeoutError:
        return None


async def _wait(coord: Coordinator, g: Group, queue: Replies) -> Verdict:
    while True:
        now = coord.clock()
        if (v := coord._tick(g, now)) is not None:
            return v
        wake = min(g.deadline_at, g.launcher.wake_at(), g.watch.wake_at())
        raw = await _next(queue, wake - now)
        if raw is not None and raw != WAKE:
            coord._on_entry(g, raw)


async def _settle(coord: Coordinator, g: Group, v: Verdict, queue: Replies) -> Verdict:
    """judging.settle, awaiting the group's queue for the judge's wake tokens."""
    evaluator = coord.pool.config.evaluator is not None
    if g.call.winner_mode is not WinnerMode.BEST or v.winner is None:
        return judging.settle(g, v, coord.store, coord.clock, coord.settings, evaluator)
    g.winner_rule = g.call.winner_mode
    reports = judging.complete_reports(g)
    now = coord.clock()
    until = min(now + coord.settings.best_judge_wait_s, g.deadline_at)
    while True:
        judged = judging._judged(coord.store, g)
        bv = decide_best(reports, judged, evaluator=evaluator, now_s=now, wait_until_s=until)
        if bv.decided:
            return judging._record(g, bv)
        await _next(queue, min(max(judging.MIN_POP_S, until - now), judging.MAX_POP_S))
        now = coord.clock()


def _retrieve(task: asyncio.Task[InvocationResult]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: a detached group's error is not "never retrieved"


async def shielded(coro: Coroutine[Any, Any, InvocationResult]) -> InvocationResult:
    """Await ``coro`` in a task of its own: a caller cancelled mid-wait (a client that
    went away) does not abandon the group, which runs to its close as a thread would."""
    task = asyncio.ensure_future(coro)
    task.add_done_callback(_retrieve)
    return await asyncio.shield(task)


async def ainvoke(
    coord: Coordinator, hub: ReplyHub, inv: RoleInvocation, group_id: str | None = None
) -> InvocationResult:
    """Coordinator.invoke as a coroutine: the same steps, the reply waits on ``hub``."""
    return await run(coord, hub, coord._plan(inv, group_id))


async def run(coord: Coordinator, hub: ReplyHub, g: Group) -> InvocationResult:
    """A planned group's launches, wait and close (:func:`ainvoke`)."""
    queue = await hub.register(g.id)
    try:
        coord._launch_initial(g)  # the group is open: Coordinator._plan opened it
        if not g.credited:
            coord.budget.earn()
        v = await _wait(coord, g, queue)
        v = await _settle(coord, g, v, queue)
        return judging.annotate(coord._finish(g, v), g)
    finally:
        hub.unregister(g.id)
