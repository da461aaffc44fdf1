"""What a coordinator plans on: a role's candidates and the policy's view of them.

One planning read (RuntimeStore.read_for_plan) gives the profiles and the cooldowns, and
opens the group and credits the hedge budget in the same round trip; a view read within
``plan_view_fresh_s`` is planned on again without a read, and the group is then opened
by the round trip that sends its members (:class:`coordinator.state.opening.GroupOpening`).
A failure or a lost member this process sees makes its role's next view a read.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable

from coordinator.config import HacoSettings
from coordinator.core.cofailure import CoFailure, Dependence
from coordinator.core.domains import PoolKey, Published, fits, pool_key
from coordinator.core.evidence import (
    DependenceMemo,
    PoolMember,
    build_view,
    domain_members,
    for_request,
    link_id,
)
from coordinator.core.methods import PoolView
from coordinator.core.params import ProfileSettings
from coordinator.runtime.pool import Pool, policy_members
from coordinator.runtime.ports import RuntimeStore
from coordinator.state.opening import GroupOpening
from coordinator.state.profilecache import PlanRead
from schemas.models import Candidate

Clock = Callable[[], float]
Credit = tuple[float, int] | None  # HedgeBudget.plan_credit
# A role's candidates, their ids, the links to them, their policy members, and the key
# the recompute publishes its pool's failure domains under.
_RoleStatic = tuple[list[Candidate], list[str], list[str], list[PoolMember], PoolKey]


class Views:
    def __init__(
        self,
        pool: Pool,
        store: RuntimeStore,
        settings: HacoSettings,
        profile_settings: ProfileSettings,
        clock: Clock = time.time,
    ) -> None:
        self.pool, self.store, self.settings = pool, store, settings
        self.profile_settings, self.clock = profile_settings, clock
        # Failure domains (issue 10): with the recompute's snapshot, looked for at most
        # every cofailure_refresh_s. A role takes its pool's from those the snapshot
        # publishes (coordinator.core.domains); only a pool they miss reads the co-failure
        # evidence, on its next view after the look, and works its own out.
        self._published: Published = {}
        self._cofailure: CoFailure | None = None
        self._evidence_due = True
        self._looked_at = -math.inf
        self._dependence = DependenceMemo(profile_settings)
        self._stale: set[str] = set()  # roles whose next view is read, whatever its age
        # Each role's last view (for a request of 0 bytes: evidence.for_request sizes it)
        # and what it was built from: build_view is a pure function of its inputs, and a
        # read that changed nothing hands back the very profile objects it handed before
        # (the plan cache's), so the same view serves again.
        self._built: dict[str, tuple[_ViewInputs, PoolView]] = {}
        self._static: dict[str, _RoleStatic] = {}  # per role: what its pool fixes

    def _role_static(self, role: str) -> _RoleStatic:
        """What a role's views read that its pool fixes: candidates (their zones checked),
        ids, links, policy members and pool key, worked out on the role's first view."""
        cands = self.pool.candidates(role)
        for c in cands:
            self.pool.check_zone(c.zone)
        caller = self.pool.config.caller_zone
        lids = sorted({link_id(caller, c.zone) for c in cands})
        members = policy_members(cands)
        key = pool_key(domain_members(members), self.profile_settings)
        return list(cands), [c.id for c in cands], lids, members, key

    def mark_stale(self, role: str) -> None:
        """``role``'s next view is read afresh (a failure or a loss was seen)."""
        self._stale.add(role)

    def _fresh_s(self, role: str) -> float:
        try:
            self._stale.remove(role)  # atomic: one planner takes the mark
        except KeyError:
            return self.settings.plan_view_fresh_s
        return 0.0

    def _look(self) -> Published:
        """The published failure domains, looked for again every cofailure_refresh_s (a
        look makes the evidence due again too)."""
        now = self.clock()
        if now - self._looked_at >= self.settings.cofailure_refresh_s:
            # Marked first: the callers that come meanwhile use what they have instead
            # of all reading it at once; a failed read is due again at once.
            since, self._looked_at = self._looked_at, now
            try:
                self._published = self.store.load_domains()
            except BaseException:
                self._looked_at = since
                raise
            self._evidence_due = True
        return self._published

    def cofailure(self) -> CoFailure | None:
        """The co-failure evidence the policy counts (the latest snapshot's)."""
        self._look()
        if self._evidence_due:
            self._cofailure = self.store.load_cofailure()  # a failed read stays due
            self._evidence_due = False
        return self._cofailure

    def _dependence_of(self, members: list[PoolMember], static: _RoleStatic) -> Dependence | None:
        """The failure domains of ``members``: the published ones of the role's whole pool,
        else worked out from the evidence (a pool the recompute does not know, or a role
        with cooling candidates left out)."""
        published, key = self._look(), static[4]
        if members is static[3] and key in published:
            dep = published[key]
            if fits(dep, len(members)):
                return dep
        return self._dependence.get(members, self.cofailure())

    def view(
        self, role: str, request_bytes: float, open_group: str | None, credit: Credit
    ) -> tuple[list[Candidate], PoolView, PlanRead]:
        """The role's candidates (cooling ones left out) and the policy's view of them,
        with ``open_group`` opened and the budget credited in the same round trip
        (RuntimeStore.read_for_plan), unless the store answered from a view read within
        plan_view_fresh_s (nothing opened: PlanRead.opened)."""
        static = self._static.get(role)
        if static is None:
            static = self._static[role] = self._role_static(role)
        all_cands, ids, lids, all_members, _ = static
        caller, ttl_s = self.pool.config.caller_zone, self.settings.group_ttl_s
        read = self.store.read_for_plan(ids, lids, open_group, ttl_s, credit, self._fresh_s(role))
        cands, members = all_cands, all_members
        if read.cooling:
            # Rate-limited candidates (keys.cooldown) sit out, unless every one of them does.
            kept = [i for i, c in enumerate(all_cands) if c.id not in read.cooling]
            if kept:
                cands = [all_cands[i] for i in kept]
                members = [all_members[i] for i in kept]
        dep = self._dependence_of(members, static)
        inputs = _ViewInputs(tuple(members), caller, read, dep)
        built = self._built.get(role)
        if built is not None and built[0].same(inputs):
            base = built[1]
        else:
            base = build_view(
                members, caller, read.candidates, read.links, 0.0, self.profile_settings, dep
            )
            self._built[role] = (inputs, base)
        return cands, for_request(base, request_bytes), read

    def opening(self, read: PlanRead, group_id: str, credit: Credit) -> GroupOpening | None:
        """What the plan's read left to open with the first members: None when it opened
        the group."""
        if read.opened:
            return None
        ttl_s = self.settings.group_ttl_s
        # Without a fused send, the same script as the read, reading nothing.
        opener = functools.partial(self.store.read_for_plan, [], [], group_id, ttl_s, credit)
        return GroupOpening(group_id, ttl_s, credit, opener)


class _ViewInputs:
    """What one role's view was built from; profiles and failure domains compared by
    identity (they are immutable, and a cache hit returns the same objects)."""

    __slots__ = ("caller", "dependence", "members", "profiles")

    def __init__(
        self,
        members: tuple[PoolMember, ...],
        caller: str,
        read: PlanRead,
        dependence: object,
    ) -> None:
        self.members, self.caller = members, caller
        self.profiles = (*read.candidates.items(), *read.links.items())
        self.dependence = dependence

    def same(self, other: _ViewInputs) -> bool:
        if (
            self.members != other.members
            or self.caller != other.caller
            or self.dependence is not other.dependence
            or len(self.profiles) != len(other.profiles)
        ):
            return False
        return all(
            k == ok and v is ov
            for (k, v), (ok, ov) in zip(self.profiles, other.profiles, strict=True)
        )
