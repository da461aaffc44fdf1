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
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from coordinator.core.params import ProfileSettings
from coordinator.core.profile_merge import merge_candidate, merge_link
from coordinator.core.profiles import CandidateProfile, LinkProfile
from coordinator.state import keys
from coordinator.state.codec import decode_candidate, decode_link, text
from coordinator.state.lean import lean_for
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
        self._plan_script = lean_for(client).script(lua("plan_read"))
        # No lock: each entry holds its token with its profile, so a read may take each
        # one as it finds it, and a write replaces whole entries in one C-level update
        # (atomic under the GIL). A lock here, taken twice by every plan, queued a hundred
        # callers of one process for seconds (bench.runtime growth, 128 in flight): a
        # holder that lost the GIL kept every other caller waiting.
        self._plan_cache: dict[str, _Entry] = {}  # "c:<id>" / "l:<id>" -> what was read
        # When a read last confirmed each field's token (its values may be older), and
        # each candidate's cooldown flag at that read: the view fresh_s may reuse.
        self._checked: dict[str, float] = {}
        self._cooling: dict[str, bool] = {}

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
        script, cache = self._plan_script, self._plan_cache
        fields = [f"c:{c}" for c in candidate_ids] + [f"l:{lk}" for lk in link_ids]
        now = self.view_clock()
        held = [cache.get(f) for f in fields]  # the entries this read relies on
        since = now - fresh_s
        if fresh_s > 0 and fields and all(self._checked.get(f, -math.inf) > since for f in fields):
            hot = {c for c in candidate_ids if self._cooling.get(c)}
            return _plan_read(candidate_ids, link_ids, held, hot)  # no round trip
        known = [
            e.token if e is not None and now - e.read_at < self.view_max_age_s else "" for e in held
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
        entries, read = list(held), {}
        s, nc = self.profile_settings, len(candidate_ids)
        for j in range(0, len(changed), 2):
            i = int(changed[j]) - 1
            if i < nc:
                prof = _merged(changed[j + 1], decode_candidate, merge_candidate, s)
            else:
                prof = _merged(changed[j + 1], decode_link, merge_link, s)
            entries[i] = read[fields[i]] = _Entry(text(tokens[i]), prof, now)
        hot = {c for c, flag in zip(candidate_ids, cooling, strict=True) if int(flag)}
        cache.update(read)  # only what this read fetched
        self._checked.update(dict.fromkeys(fields, now))
        self._cooling.update({c: c in hot for c in candidate_ids})
        return _plan_read(candidate_ids, link_ids, entries, hot, credit is not None, open_group)


def _plan_read(
    candidate_ids: Sequence[str],
    link_ids: Sequence[str],
    entries: Sequence[_Entry | None],
    hot: set[str],
    credited: bool = False,
    opened: str | None = None,
) -> PlanRead:
    """The read's answer from one entry per field (candidates, then links)."""
    nc = len(candidate_ids)
    cands = {c: e.profile for c, e in zip(candidate_ids, entries[:nc], strict=True)
             if e is not None and isinstance(e.profile, CandidateProfile)}  # fmt: skip
    links = {lk: e.profile for lk, e in zip(link_ids, entries[nc:], strict=True)
             if e is not None and isinstance(e.profile, LinkProfile)}  # fmt: skip
    return PlanRead(cands, links, hot, credited, opened is not None)
