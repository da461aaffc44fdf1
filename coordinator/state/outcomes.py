"""Outcomes of submitted invocations in Redis (keys.invocation_accepted, _result, _done).

A mixin of :class:`coordinator.state.store.RedisStore`: the store holds JSON strings and
phases only; what they mean (InvocationResult, HedgeError) is the runtime's
(:mod:`coordinator.runtime.handles`). The in-memory twin is in
:class:`coordinator.state.memstore.MemoryStore`.
"""

from __future__ import annotations

import redis

from coordinator.errors import StoreError
from coordinator.state import keys
from coordinator.state.codec import text

_MS = 1000
DONE = "done"  # the one token of keys.invocation_done


class RedisOutcomes:
    """Needs ``self.r``: a client that does not decode responses."""

    r: redis.Redis

    def set_invocation_phase(self, group_id: str, phase: str, ttl_s: float) -> None:
        """The phase ("pending", "running") of a submitted invocation, with its TTL."""
        key, px = keys.invocation_accepted(group_id), max(1, int(ttl_s * _MS))
        try:
            self.r.set(key, phase, px=px)
        except redis.RedisError as exc:
            raise StoreError(f"redis failed to record invocation {group_id!r}: {exc}") from exc

    def save_outcome(self, group_id: str, outcome: str, ttl_s: float) -> None:
        """The outcome JSON and the done token (waking every waiter), in one MULTI."""
        px = max(1, int(ttl_s * _MS))
        done = keys.invocation_done(group_id)
        try:
            pipe = self.r.pipeline(transaction=True)
            pipe.set(keys.invocation_result(group_id), outcome, px=px)
            pipe.delete(done)
            pipe.lpush(done, DONE)
            pipe.pexpire(done, px)
            pipe.execute()
        except redis.RedisError as exc:
            raise StoreError(f"redis failed to store the outcome of {group_id!r}: {exc}") from exc

    def invocation_record(self, group_id: str) -> tuple[str | None, str | None]:
        """(phase, outcome JSON) of an invocation; (None, None): unknown or expired."""
        names = [keys.invocation_accepted(group_id), keys.invocation_result(group_id)]
        try:
            phase, outcome = self.r.mget(names)
        except redis.RedisError as exc:
            raise StoreError(f"redis failed to read invocation {group_id!r}: {exc}") from exc
        return (text(phase) if phase is not None else None), (
            text(outcome) if outcome is not None else None
        )

    def wait_outcome(self, group_id: str, timeout_s: float) -> str | None:
        """The outcome JSON, waiting up to ``timeout_s`` for it (None: not yet). Blocks on
        the done token with BLMOVE from the list to itself: the token stays for others."""
        key, done = keys.invocation_result(group_id), keys.invocation_done(group_id)
        try:
            raw = self.r.get(key)
            if raw is None and timeout_s > 0:
                # Redis takes a fractional timeout; redis-py annotates it as int.
                token = self.r.blmove(done, done, timeout_s, "RIGHT", "LEFT")  # type: ignore[arg-type]
                raw = self.r.get(key) if token is not None else None
        except redis.RedisError as exc:
            raise StoreError(f"redis failed to wait for invocation {group_id!r}: {exc}") from exc
        return text(raw) if raw is not None else None
