"""Side state of groups and candidates in Redis: relayed chunks and the stream winner,
cooldowns, judgements. A mixin of :class:`coordinator.state.store.RedisStore` (kept apart
so the store module stays readable); the in-memory twin is
:class:`coordinator.state.memstore.MemoryStore`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.typing import EncodableT, FieldT

from coordinator.state import keys
from coordinator.state.codec import text

_MS = 1000


class RedisSideOps:
    """Needs ``self.r`` (bytes in, bytes out) and ``self._guard``: a RedisStore mixin."""

    r: redis.Redis
    _guard: Callable[..., Any]

    def append_chunks(self, key: str, entries: list[dict[str, str]], ttl_s: float) -> None:
        """XADD the entries (one round trip), the stream's TTL renewed."""

        def write() -> None:
            pipe = self.r.pipeline(transaction=False)
            for entry in entries:
                fields: dict[FieldT, EncodableT] = {}
                fields.update(entry)
                pipe.xadd(key, fields)
            pipe.pexpire(key, int(ttl_s * _MS))
            pipe.execute()

        self._guard("append stream chunks", write)

    def stream_winner(self, group_id: str) -> str | None:
        raw = self._guard("read a stream winner", lambda: self.r.get(keys.stream_winner(group_id)))
        return None if raw is None else text(raw)

    def set_cooldown(self, candidate_id: str, ttl_s: float, until_s: float) -> None:
        """The candidate is cooling down (rate limited) for ``ttl_s``; a longer cooldown
        already set is kept."""
        key, px = keys.cooldown(candidate_id), max(1, int(ttl_s * _MS))

        def cool() -> None:
            if not self.r.set(key, repr(until_s), px=px, nx=True):
                left = self.r.pttl(key)
                if isinstance(left, int) and 0 <= left < px:
                    self.r.set(key, repr(until_s), px=px)

        self._guard("set a cooldown", cool)

    def cooling(self, candidate_ids: Sequence[str]) -> set[str]:
        """Those of the candidates whose cooldown has not expired."""
        if not candidate_ids:
            return set()
        names = [keys.cooldown(c) for c in candidate_ids]
        found = self._guard("read cooldowns", lambda: self.r.mget(names))
        return {c for c, raw in zip(candidate_ids, found, strict=True) if raw is not None}

    def record_judged(
        self, group_id: str, member_id: str, score: float | None, ttl_s: float
    ) -> None:
        """The judge's score of a member (None: it could not score it) into the group's
        judged hash, and a wake token on its reply list for a waiting coordinator; one
        MULTI, both keys with the group's TTL."""
        judged, replies = keys.group_judged(group_id), keys.group_replies(group_id)
        px = int(ttl_s * _MS)

        def write() -> None:
            pipe = self.r.pipeline(transaction=True)
            pipe.hset(judged, member_id, "" if score is None else repr(float(score)))
            pipe.pexpire(judged, px)
            pipe.lpush(replies, keys.WAKE)
            pipe.pexpire(replies, px)
            pipe.execute()

        self._guard("record a judgement", write)

    def judged_scores(self, group_id: str) -> dict[str, float | None]:
        """Member id -> judged score (None: judged without a score) of the group."""
        raw = self._guard("read judgements", lambda: self.r.hgetall(keys.group_judged(group_id)))
        return {text(k): (float(text(v)) if text(v) else None) for k, v in raw.items()}
