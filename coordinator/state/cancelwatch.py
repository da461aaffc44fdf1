"""Cancellation delivered to running members: one watcher per worker process.

A member reads its group's state once, when it starts; after that it learns of a cancel
from its process's watcher, in memory. Whoever sets a group's signal to "cancelled"
(:meth:`RedisStore.close_group` and :meth:`RedisStore.set_group_state`) also PUBLISHes
the group id on :data:`keys.CANCELLED`; the :class:`RedisCancelWatcher` of each worker
process holds one SUBSCRIBE connection and wakes the members of that group it is running.
Cancellation thus costs O(1) Redis operations per member, whatever the call's length
(before: one read per member every ``cancel_poll_s``).

Nothing is missed, in this order:

1. a member registers its group (:meth:`CancelWatcher.watch`) *before* it reads the
   group's state, so a cancel published before the read is seen by the read, and one
   published after it reaches the watcher;
2. a publish made while the watcher is not subscribed (not yet, or reconnecting after a
   lost connection) is lost by pub/sub: after every (re)subscription the watcher
   re-validates the groups of every member it holds with one batched read (MGET), and
   only then counts as subscribed.

The watcher keeps no list of every cancelled group: only the groups of members currently
registered, each with an event the member's backend can wait on (a cancel wakes a
sleeping simulated call at once, no polling). A member that registers later reads the
state itself (1.). :class:`MemoryCancelWatcher` is the in-process twin over
:class:`coordinator.state.memstore.MemoryStore`.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import redis

from coordinator.state import keys
from coordinator.state.codec import text
from schemas.enums import GroupSignal

log = logging.getLogger(__name__)


class Watch:
    """One member's view of its group's cancel: a stop check (call it) that its backend
    can also wait on (:meth:`wait` returns early, True, once the group is cancelled)."""

    def __init__(self, owner: CancelWatcher, group_id: str) -> None:
        self.group_id = group_id
        self._owner = owner
        self._event = threading.Event()

    def __call__(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout_s: float) -> bool:
        return self._event.wait(timeout_s)

    def cancel(self) -> None:
        self._event.set()

    def close(self) -> None:
        self._owner.unwatch(self)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CancelWatcher:
    """The registry both watchers share: the members running in this process, by group."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: dict[str, set[Watch]] = {}
        self.revalidations = 0  # batched re-reads done after (re)subscribing

    def watch(self, group_id: str) -> Watch:
        """Register a member of ``group_id`` (before it reads its group's state)."""
        w = Watch(self, group_id)
        with self._lock:
            self._watches.setdefault(group_id, set()).add(w)
        return w

    def unwatch(self, w: Watch) -> None:
        with self._lock:
            group = self._watches.get(w.group_id)
            if group is not None:
                group.discard(w)
                if not group:
                    del self._watches[w.group_id]

    def running_groups(self) -> list[str]:
        with self._lock:
            return list(self._watches)

    def cancelled(self, group_id: str) -> None:
        """The group was cancelled: wake its members here (none: nothing to do)."""
        with self._lock:
            members = list(self._watches.get(group_id, ()))
        for w in members:
            w.cancel()

    def revalidate(self, read_states: Callable[[list[str]], Iterable[GroupSignal | None]]) -> None:
        """Re-read the running groups (one batched read) and cancel those cancelled."""
        groups = self.running_groups()
        self.revalidations += 1
        if not groups:
            return
        for group_id, state in zip(groups, read_states(groups), strict=True):
            if state is GroupSignal.CANCELLED:
                self.cancelled(group_id)

    def close(self) -> None:
        """Stop delivering (the Redis watcher's thread ends)."""


def _signals(raw: Iterable[bytes | str | None]) -> list[GroupSignal | None]:
    """MGET's values as signals; missing (or not a signal) = None, as the member's read."""
    out: list[GroupSignal | None] = []
    for value in raw:
        name = "" if value is None else text(value)
        out.append(GroupSignal(name) if name in GroupSignal._value2member_map_ else None)
    return out


class RedisCancelWatcher(CancelWatcher):
    """One thread and one SUBSCRIBE connection per process, started on first use.

    ``idle_s`` bounds how long the thread takes to notice :meth:`close`; after a lost
    connection it retries every ``retry_s``. Every "subscribe" confirmation (the first,
    and each one redis-py's own reconnect sends) triggers the re-validation."""

    def __init__(self, client: redis.Redis, idle_s: float, retry_s: float) -> None:
        super().__init__()
        self.r = client
        self.idle_s, self.retry_s = idle_s, retry_s
        self.name = f"haco-cancel-watch-{uuid.uuid4().hex[:12]}"  # CLIENT LIST shows it
        # Its own one-connection pool (named), apart from the members' pool.
        pool = client.connection_pool
        self._sub = redis.Redis(
            connection_pool=redis.ConnectionPool(
                connection_class=pool.connection_class,
                **{**pool.connection_kwargs, "client_name": self.name},
            )
        )
        self.subscriptions = 0
        self._failures = 0  # consecutive lost connections
        self._subscribed = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def start(self) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()

    def watch(self, group_id: str) -> Watch:
        w = super().watch(group_id)
        self.start()  # after registering: the first subscription re-validates this group
        return w

    def wait_subscribed(self, timeout_s: float) -> bool:
        """Whether the watcher is subscribed (and re-validated), waiting up to timeout_s."""
        return self._subscribed.wait(timeout_s)

    def close(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(self.idle_s + self.retry_s + 1.0)
        self._sub.connection_pool.disconnect()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._listen()
            except (redis.RedisError, OSError) as exc:
                self._subscribed.clear()
                self._failures += 1  # the first loss is a warning, its retries are not
                level = logging.WARNING if self._failures == 1 else logging.DEBUG
                log.log(level, "cancel watcher lost Redis (%s); resubscribing", exc)
                self._stop.wait(self.retry_s)

    def _listen(self) -> None:
        pubsub = self._sub.pubsub()  # type: ignore[no-untyped-call, unused-ignore]  # typed since redis 8.2
        try:
            pubsub.subscribe(keys.CANCELLED)
            while not self._stop.is_set():
                message = pubsub.get_message(timeout=self.idle_s)
                if message is not None:
                    self._handle(message)
        finally:
            self._subscribed.clear()
            pubsub.close()

    def _handle(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        kind = text(kind) if isinstance(kind, bytes | str) else None
        if kind == "subscribe":
            self.subscriptions += 1
            self._failures = 0
            self.revalidate(self._read_states)
            self._subscribed.set()
        elif kind == "message":
            self.cancelled(text(message["data"]))

    def _read_states(self, groups: list[str]) -> list[GroupSignal | None]:
        raw: list[bytes | None] = self.r.mget([keys.group_state(g) for g in groups])  # type: ignore[assignment]
        return _signals(raw)


class MemoryCancelWatcher(CancelWatcher):
    """The in-process twin: ``subscribe`` is a callback the store calls on every cancel
    (:meth:`MemoryStore.on_cancel`); subscribing re-validates as the Redis watcher does."""

    def __init__(
        self,
        subscribe: Callable[[Callable[[str], None]], None],
        read_state: Callable[[str], GroupSignal | None],
    ) -> None:
        super().__init__()
        self._read_state = read_state
        subscribe(self.cancelled)
        self.revalidate(lambda groups: [read_state(g) for g in groups])
