"""Hot-path Redis calls without redis-py's per-command machinery.

``redis.Redis.execute_command`` takes a connection from its pool (a lock, a poll of the
socket for stray data, connection-count bookkeeping), runs the call inside its retry
policy, looks the reply up in a table of some 200 response callbacks and returns the
connection: on the project's machine a script call costs the client about twice the CPU
of packing, sending and parsing the command alone, and a PING 2.5 times
(``python -m bench.leancall``). A member costs its worker two script calls and a group
costs its coordinator three calls, so that machinery was a tenth of a member's worker
CPU.

:class:`LeanRedis` keeps a stack of its own connections to the client's server, built
like the client's (its pool's connection class and arguments: URL, database, password,
TLS, timeouts), and sends a command on one with nothing in between. The stack is a
``collections.deque``: its ``pop`` and ``append`` are atomic, so threads share it without
a lock. A connection is back on the stack only after its reply was read whole; one that
raised anything is disconnected, so no connection ever carries a half-read reply.

What redis-py's path gives that this one must not lose:

- **Retries.** A connection or timeout error drops every idle connection (a restarted
  server closed them all) and runs the call again through the client itself, with the
  client's retry policy: what redis-py would have done, and no more.
- **Bounded connections.** At most ``max_connections`` (``HacoSettings.
  redis_hot_connections``) exist at once; a call that finds them all busy takes the
  client's path, which waits on the client's own pool as before.
- **Scripts.** :class:`LeanScript` sends EVALSHA, and the script's text once after a
  NOSCRIPT (a flushed or restarted server), as ``redis.commands.core.Script`` does.
- **Replies** are the parser's (no response callbacks): use it for commands whose raw
  reply is what the caller reads (scripts, BLMPOP).
- **Packing.** With hiredis installed, a command is packed by ``hiredis.pack_command``
  alone: redis-py's hiredis packer ends in the same call after a Python pass over every
  argument (about 6 of its 10 µs for a report script's 25 arguments), and the commands
  here are never of the kinds that pass converts (a command name with a space in it,
  ``bytearray`` or ``memoryview`` arguments).
- **Forks.** A child process starts with an empty stack, never the parent's sockets.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, cast

import redis
from redis.client import CaseInsensitiveDict
from redis.exceptions import NoScriptError

from coordinator.config import HacoSettings

# Connections each LeanRedis may hold: HacoSettings.redis_hot_connections' default.
DEFAULT_HOT_CONNECTIONS: int = HacoSettings.model_fields["redis_hot_connections"].default

Arg = str | bytes | int | float

try:  # redis-py packs with hiredis when it is installed (redis[hiredis]), as here
    from hiredis import pack_command as _hiredis_pack

    _pack: Callable[[tuple[Arg, ...]], bytes] | None = cast(Any, _hiredis_pack)
except ImportError:  # pragma: no cover - redis-py's own packer, through send_command
    _pack = None


class LeanRedis:
    """Commands on ``client``'s server over this object's own connections (see the
    module docstring); one per client (:func:`lean_for`)."""

    def __init__(self, client: redis.Redis, max_connections: int = DEFAULT_HOT_CONNECTIONS):
        if max_connections < 0:
            raise ValueError(f"max_connections must be >= 0, got {max_connections!r}")
        self.client = client
        # redis-py's own path, when no connection is free and to retry: a client on the
        # same pool (so with its retry policy and its wait for a free connection) that
        # applies no response callbacks, so either path gives the same raw reply.
        via = redis.Redis(connection_pool=client.connection_pool)
        via.response_callbacks = CaseInsensitiveDict({})
        self._via = via
        self._via_client: Callable[..., Any] = via.execute_command
        self.max_connections = max_connections
        pool = client.connection_pool
        self._make = pool.connection_class
        self._kwargs = dict(pool.connection_kwargs)
        self._idle: deque[Any] = deque()
        self._count = 0  # connections made and not yet disconnected for good
        self._count_lock = threading.Lock()
        self._pid = os.getpid()

    def execute(self, *args: Arg) -> Any:
        """One command, its raw reply; through the client when no connection is free."""
        conn = self._take()
        if conn is None:
            return self._via_client(*args)
        try:
            if _pack is None:
                conn.send_command(*args)
            else:  # what redis-py's hiredis packer ends in, without its pass over the args
                conn.send_packed_command((_pack(args),))
            reply = conn.read_response()
        except (redis.ConnectionError, redis.TimeoutError):
            self._drop(conn, all_idle=True)
            return self._via_client(*args)  # with the client's retry policy
        except redis.ResponseError:  # an error reply, read whole: the connection is fine
            self._give_back(conn)
            raise
        except BaseException:
            self._drop(conn)  # a reply may be half read: never reuse this connection
            raise
        self._give_back(conn)
        return reply

    def transaction(self, *commands: Sequence[Arg]) -> list[Any]:
        """MULTI, ``commands``, EXEC in one write: EXEC's raw replies, the first error
        among them raised (as redis-py's transaction pipeline raises it). Through the
        client's own pipeline when no connection is free, and to retry (its policy)."""
        if _pack is None or (conn := self._take()) is None:
            return self._via_transaction(commands)
        packed = [_pack(("MULTI",)), *(_pack(tuple(c)) for c in commands), _pack(("EXEC",))]
        try:
            conn.send_packed_command(packed)
            replies = [conn.read_response() for _ in packed]  # OK, QUEUED…, EXEC's
        except (redis.ConnectionError, redis.TimeoutError):
            self._drop(conn, all_idle=True)
            return self._via_transaction(commands)
        except BaseException:  # a command refused when queued: the replies after it unread
            self._drop(conn)
            raise
        self._give_back(conn)
        return _raise_first_error(replies[-1])

    def _via_transaction(self, commands: Sequence[Sequence[Arg]]) -> list[Any]:
        pipe: Any = self._via.pipeline(transaction=True)  # its execute_command is untyped
        for c in commands:
            pipe.execute_command(*c)
        return list(pipe.execute())

    def script(self, text: str) -> LeanScript:
        return LeanScript(self, text)

    def close(self) -> None:
        """Disconnect the idle connections (busy ones are disconnected on return)."""
        self.max_connections = 0
        self._drop_idle()

    def _take(self) -> Any:  # a redis-py connection (untyped), or None
        if os.getpid() != self._pid:  # a forked child: the parent's sockets are not ours
            self._forked()
        try:
            return self._idle.pop()
        except IndexError:
            pass
        with self._count_lock:
            if self._count >= self.max_connections:
                return None
            self._count += 1
        return self._make(**self._kwargs)  # connects on its first send

    def _give_back(self, conn: Any) -> None:
        if self.max_connections:
            self._idle.append(conn)
        else:  # closed meanwhile
            self._drop(conn)

    def _drop(self, conn: Any, all_idle: bool = False) -> None:
        conn.disconnect()
        with self._count_lock:
            self._count -= 1
        if all_idle:
            self._drop_idle()

    def _drop_idle(self) -> None:
        while True:
            try:
                conn = self._idle.pop()
            except IndexError:  # empty (another thread may have taken the last)
                return
            self._drop(conn)

    def _forked(self) -> None:
        with self._count_lock:
            if os.getpid() != self._pid:
                self._idle = deque()
                self._count = 0
                self._pid = os.getpid()


def _raise_first_error(replies: Any) -> list[Any]:
    if replies is None:  # the server aborted the transaction (EXEC's null reply)
        raise redis.exceptions.ExecAbortError("the transaction was aborted")
    for reply in replies:
        if isinstance(reply, redis.ResponseError):
            raise reply
    return list(replies)


class LeanScript:
    """A Lua script called by EVALSHA over :class:`LeanRedis`; its text is sent once
    more after a NOSCRIPT reply."""

    def __init__(self, lean: LeanRedis, text: str) -> None:
        self.lean = lean
        self.text = text
        self.sha = hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()

    def __call__(self, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
        try:
            return self.lean.execute("EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:  # a flushed or restarted server: EVAL also caches it
            return self.lean.execute("EVAL", self.text, len(keys), *keys, *args)


_ATTR = "_haco_lean"  # where a client's LeanRedis lives: it goes when the client goes
_attach_lock = threading.Lock()


def lean_for(client: redis.Redis, max_connections: int = DEFAULT_HOT_CONNECTIONS) -> LeanRedis:
    """The one LeanRedis of ``client`` (made on first use with ``max_connections``): the
    store, the plan reads and the dispatcher of a process share its connections."""
    with _attach_lock:
        lean: LeanRedis | None = getattr(client, _ATTR, None)
        if lean is None:
            lean = LeanRedis(client, max_connections)
            setattr(client, _ATTR, lean)
        return lean


def close_lean(client: redis.Redis) -> None:
    """Disconnect ``client``'s LeanRedis connections, if it has any: call beside
    ``client.close()`` (garbage collection would, later)."""
    lean: LeanRedis | None = getattr(client, _ATTR, None)
    if lean is not None:
        lean.close()
