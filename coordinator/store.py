"""Shared runtime state of hedge groups: one interface, a Redis and an in-memory backend.

Every state change that two processes can race on is atomic: the winner claim and the
idempotency claim are ``SET NX``; a group's state moves with one ``SET``; a profile
update is an optimistic ``WATCH``/``MULTI`` transaction that re-reads and re-applies the
pure update of :mod:`coordinator.profiles` if another writer got there first. Every key
is written with its TTL (see :mod:`coordinator.keys`).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeVar

import redis

from coordinator import keys
from coordinator.errors import StoreError
from coordinator.profilecodec import decode_candidate, decode_link, encode
from coordinator.profiles import (
    CandidateObservation,
    CandidateProfile,
    LinkObservation,
    LinkProfile,
    update_candidate,
    update_link_many,
)
from coordinator.settings import ProfileSettings

OPEN = "open"
RESOLVED = "resolved"
CANCELLED = "cancelled"
_MS = 1000


class RuntimeStore(Protocol):
    def open_group(self, group_id: str, ttl_s: float) -> None: ...
    def group_state(self, group_id: str) -> str | None: ...
    def set_group_state(self, group_id: str, state: str, ttl_s: float) -> None: ...
    def push_reply(self, group_id: str, report: str, ttl_s: float) -> None: ...
    def pop_reply(self, group_id: str, timeout_s: float) -> str | None: ...
    def claim_winner(self, group_id: str, member_id: str, ttl_s: float) -> bool: ...
    def claim_idempotency(self, key: str, member_id: str, ttl_s: float) -> str: ...
    def load_profiles(
        self, candidate_ids: Sequence[str], link_ids: Sequence[str]
    ) -> tuple[dict[str, CandidateProfile], dict[str, LinkProfile]]: ...
    def update_candidate(
        self, candidate_id: str, obs: CandidateObservation, settings: ProfileSettings, ttl_s: float
    ) -> None: ...
    def update_link(
        self,
        link_id: str,
        src: str,
        dst: str,
        obs: Sequence[LinkObservation],
        settings: ProfileSettings,
        ttl_s: float,
    ) -> None: ...
    def append_trace(self, report: str, maxlen: int, ttl_s: float) -> None: ...
    def incr_metrics(self, counts: Mapping[str, int], ttl_s: float) -> None: ...
    def metrics(self) -> dict[str, int]: ...


P = TypeVar("P")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisStore:
    """The production backend. ``client`` must not decode responses (bytes in, bytes out)."""

    def __init__(self, client: redis.Redis) -> None:
        self.r = client

    def _guard(self, what: str, fn: Callable[[], P]) -> P:
        try:
            return fn()
        except redis.RedisError as exc:
            raise StoreError(f"redis failed to {what}: {exc}") from exc

    def open_group(self, group_id: str, ttl_s: float) -> None:
        px = int(ttl_s * _MS)
        self._guard("open a group", lambda: self.r.set(keys.group_state(group_id), OPEN, px=px))

    def group_state(self, group_id: str) -> str | None:
        raw = self._guard("read a group state", lambda: self.r.get(keys.group_state(group_id)))
        return raw.decode() if isinstance(raw, bytes) else None

    def set_group_state(self, group_id: str, state: str, ttl_s: float) -> None:
        px = int(ttl_s * _MS)
        self._guard(
            "set a group state", lambda: self.r.set(keys.group_state(group_id), state, px=px)
        )

    def push_reply(self, group_id: str, report: str, ttl_s: float) -> None:
        key = keys.group_replies(group_id)

        def push() -> None:
            pipe = self.r.pipeline(transaction=True)
            pipe.lpush(key, report)
            pipe.pexpire(key, int(ttl_s * _MS))
            pipe.execute()

        self._guard("push a reply", push)

    def pop_reply(self, group_id: str, timeout_s: float) -> str | None:
        key = keys.group_replies(group_id)
        if timeout_s <= 0:
            raw = self._guard("pop a reply", lambda: self.r.rpop(key))
            return raw.decode() if isinstance(raw, bytes) else None
        got = self._guard("wait for a reply", lambda: self.r.brpop([key], timeout=timeout_s))
        if not got:
            return None
        value = got[1]
        return value.decode() if isinstance(value, bytes) else str(value)

    def claim_winner(self, group_id: str, member_id: str, ttl_s: float) -> bool:
        key = keys.group_winner(group_id)
        px = int(ttl_s * _MS)
        return bool(
            self._guard("claim a winner", lambda: self.r.set(key, member_id, nx=True, px=px))
        )

    def claim_idempotency(self, key: str, member_id: str, ttl_s: float) -> str:
        k = keys.idempotency(key)
        px = int(ttl_s * _MS)

        def claim() -> str:
            if self.r.set(k, member_id, nx=True, px=px):
                return member_id
            holder = self.r.get(k)
            return holder.decode() if isinstance(holder, bytes) else member_id

        return self._guard("claim an idempotency key", claim)

    def load_profiles(
        self, candidate_ids: Sequence[str], link_ids: Sequence[str]
    ) -> tuple[dict[str, CandidateProfile], dict[str, LinkProfile]]:
        names = [keys.candidate_profile(c) for c in candidate_ids]
        names += [keys.link_profile(link) for link in link_ids]
        raw = self._guard("load profiles", lambda: self.r.mget(names)) if names else []
        n = len(candidate_ids)
        cands = {c: decode_candidate(v) for c, v in zip(candidate_ids, raw[:n], strict=True) if v}
        links = {lk: decode_link(v) for lk, v in zip(link_ids, raw[n:], strict=True) if v}
        return cands, links

    def _transact(self, key: str, apply: Callable[[bytes | None], str], ttl_s: float) -> None:
        def txn(pipe: redis.client.Pipeline) -> None:
            current = pipe.get(key)
            new = apply(current if isinstance(current, bytes) else None)
            pipe.multi()
            pipe.set(key, new, px=int(ttl_s * _MS))

        self._guard("update a profile", lambda: self.r.transaction(txn, key))

    def update_candidate(
        self, candidate_id: str, obs: CandidateObservation, settings: ProfileSettings, ttl_s: float
    ) -> None:
        def apply(cur: bytes | None) -> str:
            prof = decode_candidate(cur) if cur else CandidateProfile(candidate_id)
            return encode(update_candidate(prof, obs, settings))

        self._transact(keys.candidate_profile(candidate_id), apply, ttl_s)

    def update_link(
        self,
        link_id: str,
        src: str,
        dst: str,
        obs: Sequence[LinkObservation],
        settings: ProfileSettings,
        ttl_s: float,
    ) -> None:
        def apply(cur: bytes | None) -> str:
            prof = decode_link(cur) if cur else LinkProfile(src, dst)
            return encode(update_link_many(prof, obs, settings))

        self._transact(keys.link_profile(link_id), apply, ttl_s)

    def append_trace(self, report: str, maxlen: int, ttl_s: float) -> None:
        def append() -> None:
            pipe = self.r.pipeline(transaction=False)
            pipe.xadd(keys.TRACES, {"report": report}, maxlen=maxlen, approximate=True)
            pipe.pexpire(keys.TRACES, int(ttl_s * _MS))
            pipe.execute()

        self._guard("append a trace", append)

    def incr_metrics(self, counts: Mapping[str, int], ttl_s: float) -> None:
        def incr() -> None:
            pipe = self.r.pipeline(transaction=False)
            for name, n in counts.items():
                pipe.hincrby(keys.METRICS, name, n)
            pipe.pexpire(keys.METRICS, int(ttl_s * _MS))
            pipe.execute()

        self._guard("count metrics", incr)

    def metrics(self) -> dict[str, int]:
        raw = self._guard("read metrics", lambda: self.r.hgetall(keys.METRICS))
        return {_text(k): int(v) for k, v in raw.items()}


class MemoryStore:
    """In-process backend with the same semantics, for single-process runs and tests.
    TTLs are recorded, not enforced: nothing outlives the process anyway."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self.states: dict[str, str] = {}
        self.replies: dict[str, deque[str]] = defaultdict(deque)
        self.winners: dict[str, str] = {}
        self.idem: dict[str, str] = {}
        self.candidates: dict[str, CandidateProfile] = {}
        self.links: dict[str, LinkProfile] = {}
        self.traces: list[str] = []
        self.counters: dict[str, int] = {}

    def open_group(self, group_id: str, ttl_s: float) -> None:
        with self._lock:
            self.states[group_id] = OPEN

    def group_state(self, group_id: str) -> str | None:
        with self._lock:
            return self.states.get(group_id)

    def set_group_state(self, group_id: str, state: str, ttl_s: float) -> None:
        with self._lock:
            self.states[group_id] = state

    def push_reply(self, group_id: str, report: str, ttl_s: float) -> None:
        with self._lock:
            self.replies[group_id].appendleft(report)
            self._lock.notify_all()

    def pop_reply(self, group_id: str, timeout_s: float) -> str | None:
        end = time.monotonic() + max(0.0, timeout_s)
        with self._lock:
            while not self.replies[group_id]:
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self._lock.wait(left)
            return self.replies[group_id].pop()

    def claim_winner(self, group_id: str, member_id: str, ttl_s: float) -> bool:
        with self._lock:
            if group_id in self.winners:
                return False  # SET NX semantics: even the holder's second claim fails
            self.winners[group_id] = member_id
            return True

    def claim_idempotency(self, key: str, member_id: str, ttl_s: float) -> str:
        with self._lock:
            return self.idem.setdefault(key, member_id)

    def load_profiles(
        self, candidate_ids: Sequence[str], link_ids: Sequence[str]
    ) -> tuple[dict[str, CandidateProfile], dict[str, LinkProfile]]:
        with self._lock:
            cands = {c: self.candidates[c] for c in candidate_ids if c in self.candidates}
            links = {lk: self.links[lk] for lk in link_ids if lk in self.links}
            return cands, links

    def update_candidate(
        self, candidate_id: str, obs: CandidateObservation, settings: ProfileSettings, ttl_s: float
    ) -> None:
        with self._lock:
            prof = self.candidates.get(candidate_id) or CandidateProfile(candidate_id)
            self.candidates[candidate_id] = update_candidate(prof, obs, settings)

    def update_link(
        self,
        link_id: str,
        src: str,
        dst: str,
        obs: Sequence[LinkObservation],
        settings: ProfileSettings,
        ttl_s: float,
    ) -> None:
        with self._lock:
            prof = self.links.get(link_id) or LinkProfile(src, dst)
            self.links[link_id] = update_link_many(prof, obs, settings)

    def append_trace(self, report: str, maxlen: int, ttl_s: float) -> None:
        with self._lock:
            self.traces.append(report)
            del self.traces[:-maxlen]

    def incr_metrics(self, counts: Mapping[str, int], ttl_s: float) -> None:
        with self._lock:
            for name, n in counts.items():
                self.counters[name] = self.counters.get(name, 0) + n

    def metrics(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counters)
