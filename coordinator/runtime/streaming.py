"""A relayed stream: the winner is the first member to produce a token (issue 9).

    events = astream(coordinator, hub, redis_url, invocation)
    StreamStart, then each delta (str) of that member as it arrived, then StreamEnd

:func:`astream` plans and launches like :func:`coordinator.runtime.aio.ainvoke`, every
member with ``stream_to`` (keys.member_chunks: its worker appends the deltas of each read,
then an end entry). Until a first token, it alternates XREADs of the launched members'
chunk streams (at most ``stream_block_s``, on one connection of its own) with the group's
replies and ``Coordinator._tick`` (stagger launches, patience, deadline). The first member
with a delta is the stream winner (keys.stream_winner, SET NX): with ``cancel_losers`` the
group is cancelled at once and only that member keeps running (workers.streamsink).
Its deltas are relayed until its end entry; then its report closes the group as usual
(the one winner claim, the verdict recorded).

- Only the ``first`` winner rule can pick at the first token; any other rule runs the
  invocation to its end and yields :class:`Buffered` (the API re-chunks its text).
- A group decided before any token (members that do not stream report at once, with
  their whole output as one delta) is closed as usual and relayed from its result.
- The winner failing mid-stream (or the deadline) ends the relay with ``StreamEnd(ok=False)``;
  the group is closed without a winner. A consumer that goes away mid-stream closes it
  the same way (the stream winner's claim deleted first, so that member stops too).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import cast

import redis
import redis.asyncio as aioredis
from redis.typing import KeyT, StreamIdT

from coordinator.core.winner import Verdict
from coordinator.errors import HedgeError, StoreError
from coordinator.runtime import aio, judging
from coordinator.runtime.coordinator import WAKE, Coordinator
from coordinator.runtime.group import Group
from coordinator.runtime.results import InvocationResult
from coordinator.state import keys
from coordinator.state.codec import text
from schemas.enums import GroupSignal, WinnerMode
from schemas.models import RoleInvocation

_MS = 1000
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StreamStart:
    group_id: str
    member_id: str
    candidate_id: str
    zone: str


@dataclass(frozen=True, slots=True)
class StreamEnd:
    ok: bool
    reason: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    outcome: InvocationResult | HedgeError | None = None  # the group's close


@dataclass(frozen=True, slots=True)
class Buffered:
    """Not relayed (the winner rule is not ``first``): the finished result."""

    result: InvocationResult


StreamEvent = StreamStart | str | StreamEnd | Buffered
Entry = dict[str, str]


async def astream(
    coord: Coordinator, hub: aio.ReplyHub, url: str, inv: RoleInvocation
) -> AsyncIterator[StreamEvent]:
    g = coord._plan(inv)
    if g.call.winner_mode is not WinnerMode.FIRST:
        yield Buffered(await aio.shielded(aio.run(coord, hub, g)))
        return
    g.stream = True
    queue = await hub.register(g.id)
    relay = _Relay(coord, g, queue, aioredis.Redis.from_url(url, single_connection_client=True))
    try:
        async for event in relay.events():
            yield event
    finally:
        hub.unregister(g.id)
        # Shielded: a consumer cancelled mid-stream still closes the group and the connection.
        await asyncio.shield(relay.release())


class _Relay:
    def __init__(
        self, coord: Coordinator, g: Group, queue: aio.Replies, conn: aioredis.Redis
    ) -> None:
        self.coord, self.g, self.queue, self.conn = coord, g, queue, conn
        self.seen: dict[str, str] = {}  # chunk stream -> the last entry id read
        self.closed = False

    async def events(self) -> AsyncIterator[StreamEvent]:
        coord, g = self.coord, self.g
        # Coordinator._plan opened the group (and credited a budget kept in Redis).
        if not g.credited:
            coord.budget.earn()
        coord._launch_initial(g)
        first = await self._first_token()
        if isinstance(first, Verdict):  # decided before any token
            for event in _relayed(await self._close(first)):
                yield event
            return
        rank, entries = first
        yield await self._choose(rank)
        end = StreamEnd(False, "the deadline passed mid-stream")
        async for entry in self._entries(rank, entries):
            if "d" in entry:
                yield entry["d"]
            else:
                end = _end(entry)
        yield await self._finish(rank, end)

    async def _first_token(self) -> tuple[int, list[Entry]] | Verdict:
        coord, g, block_s = self.coord, self.g, self.coord.settings.stream_block_s
        while True:
            now = coord.clock()
            if (v := coord._tick(g, now)) is not None:
                return v
            wake = min(g.deadline_at, g.launcher.wake_at(), g.watch.wake_at())
            streams = {keys.member_chunks(g.id, r): "0" for r in range(g.launcher.launched)}
            streams.update((k, i) for k, i in self.seen.items() if k in streams)
            got = await self._read(streams, max(0.001, min(wake - now, block_s)))
            for rank, entries in got:
                if "d" in entries[0]:
                    return rank, entries
            while (raw := await aio._next(self.queue, 0)) is not None:
                if raw != WAKE:
                    coord._on_entry(g, raw)

    async def _read(self, streams: dict[str, str], block_s: float) -> list[tuple[int, list[Entry]]]:
        """The new entries of each stream, the earliest first entry first."""
        ids: dict[KeyT, StreamIdT] = {}
        ids.update(streams)
        raw = await self.conn.xread(ids, block=max(1, int(block_s * _MS)))
        got = cast(list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]], raw or [])
        out: list[tuple[tuple[int, ...], int, list[Entry]]] = []
        for raw_key, raw_entries in got:
            key = text(raw_key)
            self.seen[key] = text(raw_entries[-1][0])
            entries = [{text(k): text(v) for k, v in e[1].items()} for e in raw_entries]
            first_id = tuple(int(p) for p in text(raw_entries[0][0]).split("-"))
            out.append((first_id, int(key.split(":")[-2]), entries))
        out.sort(key=lambda x: x[0])
        return [(rank, entries) for _, rank, entries in out]

    async def _choose(self, rank: int) -> StreamStart:
        """Claim the stream (exactly one relay); cancel the others per the settings."""
        coord, g = self.coord, self.g
        ttl_ms = int(coord.settings.group_ttl_s * _MS)
        member = g.member_id(rank)
        await self.conn.set(keys.stream_winner(g.id), member, nx=True, px=ttl_ms)
        if coord.settings.cancel_losers:
            coord.store.set_group_state(g.id, GroupSignal.CANCELLED, coord.settings.group_ttl_s)
        cand = g.candidates[rank]
        return StreamStart(g.id, member, cand.id, cand.zone)

    async def _entries(self, rank: int, first: list[Entry]) -> AsyncIterator[Entry]:
        key = keys.member_chunks(self.g.id, rank)
        pending = first
        while True:
            for entry in pending:
                yield entry
                if "end" in entry:
                    return
            left = self.g.deadline_at - self.coord.clock()
            if left <= 0:
                return
            got = await self._read({key: self.seen[key]}, min(left, self.coord.settings.hub_idle_s))
            pending = got[0][1] if got else []

    async def _finish(self, rank: int, end: StreamEnd) -> StreamEnd:
        """After the winner's end entry: its report, then the usual close."""
        g = self.g
        while end.ok and g.reports[rank] is None:
            raw = await aio._next(self.queue, g.deadline_at - self.coord.clock())
            if raw is None:
                break
            if raw != WAKE:
                self.coord._on_entry(g, raw)
        rep = g.reports[rank]
        won = end.ok and rep is not None and rep.trace.success
        try:
            result = await self._close(Verdict(True, rank if won else None))
        except HedgeError as exc:
            return StreamEnd(False, end.reason or str(exc), end.tokens_in, end.tokens_out, exc)
        return replace(end, outcome=result)

    async def _close(self, v: Verdict) -> InvocationResult:
        self.closed = True
        coord, g = self.coord, self.g
        v = await aio._settle(coord, g, v, self.queue)
        return judging.annotate(coord._finish(g, v), g)

    async def release(self) -> None:
        """The relay's end. One left before its close (its consumer went away): the group
        closed without a winner, and the stream winner's claim dropped so that member
        stops too. Then its connection closed."""
        try:
            if not self.closed:
                self.closed = True
                with contextlib.suppress(HedgeError, StoreError):
                    self.coord._finish(self.g, Verdict(True, None))
                await self.conn.delete(keys.stream_winner(self.g.id))
        except redis.RedisError as exc:
            log.warning("relay of group %s: its stream claim not dropped: %s", self.g.id, exc)
        finally:
            await self.conn.aclose()


def _relayed(result: InvocationResult) -> list[StreamEvent]:
    """A group won before any token: its result as a relay (one delta)."""
    win = next(m for m in result.members if m.candidate_id == result.candidate_id)
    start = StreamStart(result.group_id, win.member_id, win.candidate_id, win.zone)
    end = StreamEnd(True, "", win.tokens_in, win.tokens_out, result)
    return [start, result.output or "", end]


def _end(entry: Entry) -> StreamEnd:
    ok = entry.get("end") == "ok"
    tin, tout = int(entry.get("tokens_in", "0")), int(entry.get("tokens_out", "0"))
    return StreamEnd(ok, "" if ok else entry.get("reason", "failed"), tin, tout)
