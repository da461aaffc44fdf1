"""Shared runtime state of hedge groups: one interface, a Redis and an in-memory backend.

Every state change that two processes can race on is atomic: the winner claim and the
idempotency claim are ``SET NX``; a group's signal moves with one ``SET``; closing a group
(its signal, winner claim, counters and verdict record) is one Lua script that acts once
per group (:meth:`RedisStore.close_group`); a worker's report (reply, outcome claim,
profile fold, trace) is one Lua script (:mod:`coordinator.state.memberops`); the rarer
profile writes (a lost member, a late judgement) are optimistic ``WATCH``/``MULTI``
transactions that re-read and re-apply the pure update of :mod:`coordinator.core.profiles`
if another writer got there first. Every key is written with its TTL (see
:mod:`coordinator.state.keys`).

Profiles in Redis are a recomputed snapshot plus per-epoch deltas (:mod:`coordinator.
epochs`): every profile write folds into the current epoch's delta, and a worker's outcome
(:meth:`RedisStore.record_outcome`) writes its deltas and its trace entry in one
transaction; :meth:`RedisStore.load_profiles` returns the merged, effective profiles.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import redis

from coordinator.core.cofailure import CoFailure, Dependence
from coordinator.core.domains import Published
from coordinator.core.params import ProfileSettings
from coordinator.core.profiles import (
    CandidateObservation,
    CandidateProfile,
    LinkObservation,
    LinkProfile,
    apply_quality,
    update_candidate,
    update_link_many,
)
from coordinator.errors import InputError, StoreError
from coordinator.state import keys
from coordinator.state.closing import CloseLimits, GroupClose, GroupClosed
from coordinator.state.codec import text
from coordinator.state.epochs import (
    DeltaWrite,
    ProfileView,
    SnapshotField,
    read_cofailure,
    read_domains,
    read_view,
    snapshot_version,
    write_delta,
)
from coordinator.state.lean import lean_for
from coordinator.state.lua import script
from coordinator.state.memberops import OutcomeLimits, RedisMemberOps
from coordinator.state.outcomes import RedisOutcomes
from coordinator.state.profilecache import RedisPlanReads
from coordinator.state.sideops import RedisSideOps
from schemas.enums import GroupSignal

_MS = 1000
log = logging.getLogger(__name__)


def _read_domains(r: redis.Redis) -> tuple[str | None, Published]:
    """epochs.read_domains; published domains that do not decode are left aside (logged):
    they are a cache of what the evidence gives, and plans then work theirs out from it,
    as for a pool they do not cover."""
    try:
        return read_domains(r)
    except InputError as exc:
        version = snapshot_version(r)
        log.warning("snapshot v%s: published failure domains not taken: %s", version, exc)
        return version, {}


def _signal(raw: object) -> GroupSignal | None:
    if raw is None:
        return None
    value = raw.decode() if isinstance(raw, bytes) else str(raw)
    try:
        return GroupSignal(value)
    except ValueError as exc:
        known = ", ".join(s.value for s in GroupSignal)
        raise StoreError(f"unknown group signal {value!r}; expected one of {known}") from exc


P = TypeVar("P")


def _fold_candidate(
    prof: CandidateProfile, obs: CandidateObservation, settings: ProfileSettings
) -> CandidateProfile:
    return update_candidate(prof, obs, settings)


def _fold_link(
    prof: LinkProfile, obs: Sequence[LinkObservation], settings: ProfileSettings
) -> LinkProfile:
    return update_link_many(prof, obs, settings)


def server_url(client: redis.Redis) -> str:
    """The redis:// URL (no password) ``client`` connects to, for error messages."""
    kw = client.connection_pool.connection_kwargs
    if "path" in kw:
        return f"unix://{kw['path']}?db={kw.get('db', 0)}"
    return f"redis://{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"


class RedisStore(RedisOutcomes, RedisMemberOps, RedisPlanReads, RedisSideOps):
    """The production backend. ``client`` must not decode responses (bytes in, bytes out).
    ``profile_settings`` is how deltas merge onto the snapshot (the workers' decay).
    Submitted invocations' outcomes: :class:`coordinator.state.outcomes.RedisOutcomes`."""

    def __init__(
        self,
        client: redis.Redis,
        profile_settings: ProfileSettings | None = None,
        view_max_age_s: float = 30.0,  # HacoSettings.profile_view_max_age_s
    ) -> None:
        self.r = client
        self.profile_settings = profile_settings or ProfileSettings()
        self._lean = lean_for(client)  # the hot path's calls (coordinator.state.lean)
        self._close = self._lean.script(script("close_group"))  # EVALSHA: sent once
        self._claim_peek = self._lean.script(script("claim_peek"))
        self._init_member_ops(client)
        self._init_plan_reads(client, view_max_age_s)
        # Threads of one worker that fold into the same delta key would make each other's
        # WATCH fail and retry; queueing them on a per-key lock in the process costs less.
        self._key_locks: dict[str, threading.Lock] = defaultdict(threading.Lock)
        self._locks_guard = threading.Lock()
        self._cofailure: SnapshotField[CoFailure | None] = SnapshotField(read_cofailure, None)
        self._domains: SnapshotField[Published] = SnapshotField(_read_domains, {})

    def _key_lock(self, write: DeltaWrite) -> threading.Lock:
        name = write.candidate[0] if write.candidate else write.link[0] if write.link else ""
        with self._locks_guard:
            return self._key_locks[name]

    def _guard(self, what: str, fn: Callable[[], P]) -> P:
        try:
            return fn()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            # Down or restarting (redis-py reconnects by itself once it is back).
            raise StoreError(
                f"redis failed to {what}: {server_url(self.r)} is unreachable: {exc}"
            ) from exc
        except redis.RedisError as exc:
            raise StoreError(f"redis failed to {what}: {exc}") from exc

    def open_group(self, group_id: str, ttl_s: float) -> None:
        px = int(ttl_s * _MS)
        key = keys.group_state(group_id)
        self._guard("open a group", lambda: self.r.set(key, GroupSignal.OPEN.value, px=px))

    def group_state(self, group_id: str) -> GroupSignal | None:
        """The group's signal to its members; None: the group is gone or never existed."""
        raw = self._guard("read a group state", lambda: self.r.get(keys.group_state(group_id)))
        return _signal(raw)

    def set_group_state(self, group_id: str, signal: GroupSignal, ttl_s: float) -> None:
        """A cancel is also PUBLISHed (keys.CANCELLED) for the workers' cancel watchers."""
        px = int(ttl_s * _MS)
        key = keys.group_state(group_id)

        def write() -> None:
            pipe = self.r.pipeline(transaction=True)
            pipe.set(key, signal.value, px=px)
            if signal is GroupSignal.CANCELLED:
                pipe.publish(keys.CANCELLED, group_id)
            pipe.execute()

        self._guard("set a group state", write)

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
        got = self._guard("wait for a reply", lambda: self._lean.execute("BRPOP", key, timeout_s))
        if not got:
            return None
        value = got[1]
        return value.decode() if isinstance(value, bytes) else str(value)

    def pop_replies(self, group_id: str, timeout_s: float, max_n: int) -> list[str]:
        """Up to ``max_n`` entries, oldest first, waiting up to ``timeout_s`` for the first:
        one BLMPOP, so a start token and the report that follows it cost one round trip."""
        key = keys.group_replies(group_id)
        got: Any = self._guard(
            "wait for a reply",
            lambda: self._lean.execute(
                "BLMPOP", max(timeout_s, 0.001), 1, key, "RIGHT", "COUNT", max_n
            ),
        )
        return [text(v) for v in got[1]] if got else []

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

    def claim_and_peek(self, key: str, member_id: str, ttl_s: float, peek: str) -> tuple[str, bool]:
        k, px = [keys.idempotency(key), keys.idempotency(peek)], int(ttl_s * _MS)
        holder, held = self._guard(
            "claim an idempotency key", lambda: self._claim_peek(k, [member_id, px])
        )
        return text(holder), bool(held)

    def load_view(self, candidate_ids: Sequence[str], link_ids: Sequence[str]) -> ProfileView:
        """Effective profiles (snapshot + later deltas, one atomic read) and their version."""
        return self._guard(
            "load profiles",
            lambda: read_view(self.r, candidate_ids, link_ids, self.profile_settings),
        )

    def load_cofailure(self) -> CoFailure | None:
        """The adopted snapshot's co-failure evidence (coordinator.core.cofailure); read
        again only when the snapshot's version changed."""
        return self._guard("load co-failure evidence", lambda: self._cofailure.get(self.r))

    def load_domains(self) -> Mapping[str, Dependence | None]:
        """The failure domains the adopted snapshot publishes, by pool key
        (coordinator.core.domains); read again only when the snapshot's version changed."""
        return self._guard("load published failure domains", lambda: self._domains.get(self.r))

    def load_profiles(
        self, candidate_ids: Sequence[str], link_ids: Sequence[str]
    ) -> tuple[dict[str, CandidateProfile], dict[str, LinkProfile]]:
        if not candidate_ids and not link_ids:
            return {}, {}
        view = self.load_view(candidate_ids, link_ids)
        return view.candidates, view.links

    def _write(self, what: str, write: DeltaWrite, ttl_s: float) -> None:
        with self._key_lock(write):
            self._guard(what, lambda: write_delta(self.r, write, ttl_s))

    def update_candidate(
        self, candidate_id: str, obs: CandidateObservation, settings: ProfileSettings, ttl_s: float
    ) -> None:
        fold = functools.partial(_fold_candidate, obs=obs, settings=settings)
        self._write("update a profile", DeltaWrite(candidate=(candidate_id, fold)), ttl_s)

    def apply_quality(
        self, candidate_id: str, q: float, settings: ProfileSettings, ttl_s: float, at_s: float
    ) -> None:
        """A late judgement into the candidate's Beta (profiles.apply_quality), no call
        counted; WATCH/MULTI like :meth:`update_candidate`."""

        def judge(prof: CandidateProfile) -> CandidateProfile:
            return apply_quality(prof, q, settings, at_s)

        self._write("update a profile", DeltaWrite(candidate=(candidate_id, judge)), ttl_s)

    def update_link(
        self,
        link_id: str,
        src: str,
        dst: str,
        obs: Sequence[LinkObservation],
        settings: ProfileSettings,
        ttl_s: float,
    ) -> None:
        fold = functools.partial(_fold_link, obs=obs, settings=settings)
        self._write("update a profile", DeltaWrite(link=(link_id, src, dst, fold)), ttl_s)

    def record_outcome(
        self,
        candidate_id: str,
        cand_obs: CandidateObservation | None,
        link_id: str,
        src: str,
        dst: str,
        link_obs: Sequence[LinkObservation],
        report: str,
        settings: ProfileSettings,
        limits: OutcomeLimits,
    ) -> None:
        """One member's outcome in one transaction: fold the observations into the current
        epoch's deltas and append the trace, so the trace's stream id and the epoch it was
        counted in agree (see coordinator.state.epochs). ``cand_obs=None``: trace only."""
        cand = link = None
        if cand_obs is not None:
            cand = (
                candidate_id,
                functools.partial(_fold_candidate, obs=cand_obs, settings=settings),
            )
        if link_obs:
            link = (
                link_id,
                src,
                dst,
                functools.partial(_fold_link, obs=link_obs, settings=settings),
            )
        write = DeltaWrite(cand, link, report, limits.trace_maxlen, limits.trace_ttl_s)
        self._write("record an outcome", write, limits.profile_ttl_s)

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

    def close_group(self, close: GroupClose, limits: CloseLimits) -> GroupClosed:
        """Signal, claim, counters and the verdict record in one script, once per group:
        the winner key is the group's claim (``SET NX`` semantics: the winning member, or
        empty for none); a group claimed before is left untouched, and its claimed winner
        is returned."""
        g = close.group_id
        group_keys = [
            keys.group_state(g), keys.group_winner(g), keys.METRICS, keys.TRACES, keys.CANCELLED,
        ]  # fmt: skip
        args: list[str | int] = [
            close.signal.value, close.winner_member or "", int(limits.group_ttl_s * _MS),
            int(limits.metrics_ttl_s * _MS), keys.VERDICT_FIELD, close.verdict,
            limits.trace_maxlen, int(limits.trace_ttl_s * _MS), g,
        ]  # fmt: skip
        for name, n in close.counts.items():
            args += [name, n]

        def run() -> GroupClosed:
            applied, holder = self._close(keys=group_keys, args=args)
            return GroupClosed(bool(applied), text(holder) or None)

        return self._guard("close a group", run)

    def hold_close(self, group_id: str, ttl_s: float) -> None:
        """Its coordinator gave up on a member: the group's first report no longer closes
        it (keys.group_reports), so the close, made by the coordinator, counts that member."""
        key, px = keys.group_reports(group_id), max(1, int(ttl_s * _MS))

        def count() -> None:
            pipe = self.r.pipeline(transaction=True)
            pipe.incr(key)
            pipe.pexpire(key, px)
            pipe.execute()

        self._guard("hold a group's close", count)

    def metrics(self) -> dict[str, int]:
        raw = self._guard("read metrics", lambda: self.r.hgetall(keys.METRICS))
        return {text(k): int(v) for k, v in raw.items()}
