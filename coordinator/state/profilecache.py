"""The coordinator's read before it plans a group, one round trip (``plan_read.lua``):
the role's effective profiles, which candidates are cooling down, and the group opened.

Profiles are cached between changes. Each profile's token is the snapshot version, the
snapshot's and the current epoch, and the profile's write counter
(:data:`coordinator.state.keys.PROFILE_VERSIONS`, bumped by every delta write); the
script sends values only for profiles whose token changed since this process read them,
so an unchanged pool costs no transfer and no decoding. A cached profile is re-read after
``max_age_s`` all the same: a delta that expired (``profile_ttl_s`` without a write)
changes a profile without a write.

A caller may also accept the whole view as it is when every profile and cooldown flag of
it was read within ``fresh_s`` (HacoSettings.plan_view_fresh_s): then there is no round
trip at all, and nothing is opened or credited (:attr:`PlanRead.opened` is False; the
coordinator opens the group in the round trip that sends its members).

The in-memory twin is :meth:`coordinator.state.memstore.MemoryStore.read_for_plan`.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from coordinator.core.params import ProfileSettings
from coordinator.core.profiles import CandidateProfile, LinkProfile, merge_candidate, merge_link
from coordinator.state import keys
from coordinator.state.codec import decode_candidate, decode_link, text
from coordinator.state.lua import lua
from schemas.enums import GroupSignal

_MS = 1000
Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class PlanRead:
    candidates: dict[str, CandidateProfile]  # ids without evidence are absent
    links: dict[str, LinkProfile]
    cooling: set[str]  # candidates whose cooldown has not expired (keys.cooldown)
    credited: bool = False  # the hedge budget was credited (keys.BUDGET's ``pend``)
    opened: bool = False  # the group asked for was opened by this read


@dataclass(frozen=True, slots=True)
class _Entry:
    token: str
    profile: CandidateProfile | LinkProfile | None
    read_at: float


def _merged(values: Sequence[bytes | str], decode: Any, merge: Any, s: ProfileSettings) -> Any:
    acc = None
    for raw in values:
        if raw:
            acc = merge(acc, decode(raw), s)
    return acc


class RedisPlanReads:
    """Needs ``self._guard`` and ``self.profile_settings``: a RedisStore mixin, set up by
    :meth:`_init_plan_reads`. ``view_clock`` (the cache's age) may be replaced (tests)."""

    profile_settings: ProfileSettings
    _guard: Callable[..., Any]
    view_clock: Clock = time.monotonic

    def _init_plan_reads(self, client: redis.Redis, view_max_age_s: float) -> None:
        """The read's script and an empty cache: the store's init."""
        self.view_max_age_s = view_max_age_s
        self._plan_script = client.register_script(lua("plan_read"))
        self._plan_cache: dict[str, _Entry] = {}  # "c:<id>" / "l:<id>" -> what was read
        self._plan_lock = threading.Lock()
        # When each field's token was last confirmed by a read (its values may be older),
        # and each candidate's cooldown flag: the view that fresh_s may reuse.
        self._checked: dict[str, float] = {}
        self._cool_cache: dict[str, tuple[bool, float]] = {}  # id -> (cooling, read at)

    def read_for_plan(
        self,
        candidate_ids: Sequence[str],
        link_ids: Sequence[str],
        open_group: str | None = None,
        group_ttl_s: float = 0.0,
        credit: tuple[float, int] | None = None,
        fresh_s: float = 0.0,
    ) -> PlanRead:
        """The profiles of ``candidate_ids`` and ``link_ids`` (snapshot + deltas, as
        :meth:`RedisStore.load_view`), the cooling candidates, ``open_group`` opened with
        ``group_ttl_s`` (:meth:`RedisStore.open_group`) and the hedge budget credited with
        ``credit`` (RedisBudget.plan_credit), in the same script; or, when all of it was
        read within ``fresh_s``, the cached view with nothing opened or credited."""
        script, cache, lock = self._plan_script, self._plan_cache, self._plan_lock
        fields = [f"c:{c}" for c in candidate_ids] + [f"l:{lk}" for lk in link_ids]
        now = self.view_clock()
        with lock:  # the entries this read relies on, as they are now
            held = {f: cache.get(f) for f in fields}
            checked = [self._checked.get(f, -math.inf) for f in fields]
            cool = [self._cool_cache.get(c) for c in candidate_ids]
        if fresh_s > 0 and fields and min(checked) > now - fresh_s:
            view = _fresh_view(candidate_ids, link_ids, held, cool, now - fresh_s)
            if view is not None:
                return view
        known = [
            e.token if e is not None and now - e.read_at < self.view_max_age_s else ""
            for e in (held[f] for f in fields)
        ]
        ttl_ms = max(1, int(group_ttl_s * _MS)) if open_group is not None else 0
        names = [keys.PROFILE_SNAPSHOT, keys.PROFILE_EPOCH, keys.PROFILE_VERSIONS,
                 keys.group_state(open_group or "-"), keys.BUDGET]  # fmt: skip
        amount, budget_ttl_ms = credit if credit is not None else (0.0, 0)
        args: list[str | int] = [
            keys.DELTA_PREFIX, len(candidate_ids), len(link_ids), keys.COOLDOWN_PREFIX,
            ttl_ms, GroupSignal.OPEN.value, repr(float(amount)), budget_ttl_ms,
            *candidate_ids, *link_ids, *known,
        ]  # fmt: skip
        got: Any = self._guard("read profiles", lambda: script(keys=names, args=args))
        tokens, changed, cooling = got
        fresh: dict[str, _Entry] = {}
        s, nc = self.profile_settings, len(candidate_ids)
        for j in range(0, len(changed), 2):
            i = int(changed[j]) - 1
            if i < nc:
                prof = _merged(changed[j + 1], decode_candidate, merge_candidate, s)
            else:
                prof = _merged(changed[j + 1], decode_link, merge_link, s)
            fresh[fields[i]] = _Entry(text(tokens[i]), prof, now)
        if fresh:
            with lock:
                cache.update(fresh)
        entries = [fresh.get(f) or held[f] for f in fields]
        cands = {c: e.profile for c, e in zip(candidate_ids, entries[:nc], strict=True)
                 if e is not None and isinstance(e.profile, CandidateProfile)}  # fmt: skip
        links = {lk: e.profile for lk, e in zip(link_ids, entries[nc:], strict=True)
                 if e is not None and isinstance(e.profile, LinkProfile)}  # fmt: skip
        hot = {c for c, flag in zip(candidate_ids, cooling, strict=True) if int(flag)}
        with lock:
            self._checked.update((f, now) for f in fields)
            self._cool_cache.update((c, (c in hot, now)) for c in candidate_ids)
        return PlanRead(cands, links, hot, credit is not None, open_group is not None)


def _fresh_view(
    candidate_ids: Sequence[str],
    link_ids: Sequence[str],
    held: dict[str, _Entry | None],
    cool: Sequence[tuple[bool, float] | None],
    since: float,
) -> PlanRead | None:
    """The view from the cache when every cooldown flag of it was read after ``since``
    (its profiles were: the caller checked), else None."""
    if any(e is None for e in held.values()):
        return None
    if any(c is None or c[1] <= since for c in cool):
        return None
    cands: dict[str, CandidateProfile] = {}
    for c in candidate_ids:
        p = held[f"c:{c}"]
        if p is not None and isinstance(p.profile, CandidateProfile):
            cands[c] = p.profile
    links: dict[str, LinkProfile] = {}
    for lk in link_ids:
        q = held[f"l:{lk}"]
        if q is not None and isinstance(q.profile, LinkProfile):
            links[lk] = q.profile
    hot = {c for c, flag in zip(candidate_ids, cool, strict=True) if flag is not None and flag[0]}
    return PlanRead(cands, links, hot)
