"""The ports the runtime depends on: shared state, the hedge budget, the hedge-delay
window and the dispatcher. Each has a Redis (or Celery) implementation and an in-memory
twin in :mod:`coordinator.state` and :mod:`coordinator.runtime.dispatch`; they satisfy
these protocols structurally, so the state package never imports the runtime.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from coordinator.core.cofailure import CoFailure, Dependence
from coordinator.core.params import ProfileSettings
from coordinator.core.profiles import (
    CandidateObservation,
    CandidateProfile,
    LinkObservation,
    LinkProfile,
)
from coordinator.state.budget import BudgetSnapshot
from coordinator.state.closing import CloseLimits, GroupClose, GroupClosed
from coordinator.state.memberops import MemberOutcome, MemberStart, OutcomeLimits, Started
from coordinator.state.opening import GroupOpening
from coordinator.state.profilecache import PlanRead
from schemas.enums import GroupSignal
from schemas.models import MemberTask


class RuntimeStore(Protocol):
    def open_group(self, group_id: str, ttl_s: float) -> None: ...
    def group_state(self, group_id: str) -> GroupSignal | None: ...
    def set_group_state(self, group_id: str, signal: GroupSignal, ttl_s: float) -> None: ...
    def push_reply(self, group_id: str, report: str, ttl_s: float) -> None: ...
    def pop_reply(self, group_id: str, timeout_s: float) -> str | None: ...
    def pop_replies(self, group_id: str, timeout_s: float, max_n: int) -> list[str]:
        """Up to ``max_n`` entries (oldest first), waiting up to ``timeout_s`` for one."""
        ...

    def claim_winner(self, group_id: str, member_id: str, ttl_s: float) -> bool: ...
    def append_chunks(self, key: str, entries: list[dict[str, str]], ttl_s: float) -> None: ...
    def stream_winner(self, group_id: str) -> str | None: ...
    def claim_idempotency(self, key: str, member_id: str, ttl_s: float) -> str: ...
    def claim_and_peek(self, key: str, member_id: str, ttl_s: float, peek: str) -> tuple[str, bool]:
        """:meth:`claim_idempotency` of ``key``, and whether the idempotency key ``peek`` is
        held, in one round trip."""

    def set_cooldown(self, candidate_id: str, ttl_s: float, until_s: float) -> None:
        """A rate-limited candidate is not planned for ``ttl_s`` (keys.cooldown)."""
        ...

    def cooling(self, candidate_ids: Sequence[str]) -> set[str]: ...
    def record_judged(
        self, group_id: str, member_id: str, score: float | None, ttl_s: float
    ) -> None:
        """The judge's score (None: unscored) into keys.group_judged, and a wake token."""
        ...

    def judged_scores(self, group_id: str) -> dict[str, float | None]: ...
    def load_profiles(
        self, candidate_ids: Sequence[str], link_ids: Sequence[str]
    ) -> tuple[dict[str, CandidateProfile], dict[str, LinkProfile]]: ...
    def read_for_plan(
        self,
        candidate_ids: Sequence[str],
        link_ids: Sequence[str],
        open_group: str | None = None,
        group_ttl_s: float = 0.0,
        credit: tuple[float, int] | None = None,
        fresh_s: float = 0.0,
    ) -> PlanRead:
        """Profiles and cooldowns of a role, the group opened and (where the budget
        lives in the same store) the budget credited: one round trip. A store may answer
        from a view read within ``fresh_s`` instead, opening nothing (PlanRead.opened)."""
        ...

    def load_cofailure(self) -> CoFailure | None: ...
    def load_domains(self) -> Mapping[str, Dependence | None]: ...
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
    ) -> None: ...

    # The worker's hot path (coordinator.state.memberops): one round trip each.
    records_delays: bool  # report_member can write the role's hedge-delay window

    def start_member(self, s: MemberStart) -> tuple[GroupSignal | None, Started]: ...
    def report_member(
        self, o: MemberOutcome, settings: ProfileSettings, limits: OutcomeLimits
    ) -> bool: ...
    def incr_metrics(self, counts: Mapping[str, int], ttl_s: float) -> None: ...
    def metrics(self) -> dict[str, int]: ...
    def hold_close(self, group_id: str, ttl_s: float) -> None:
        """The group's first report no longer closes it (a staged close: coordinator.state.
        closing); its coordinator gave up on a member and closes the group itself."""
        ...

    def close_group(self, close: GroupClose, limits: CloseLimits) -> GroupClosed:
        """Close the group once (signal, winner claim, counters, verdict record); a group
        closed before is left as it is, and its winner is returned."""
        ...


class OutcomeStore(Protocol):
    """Submitted invocations (keys.invocation_accepted, _result, _done): their phase and
    outcome JSON, readable from any process (RedisStore via state.outcomes; MemoryStore)."""

    def set_invocation_phase(self, group_id: str, phase: str, ttl_s: float) -> None: ...
    def save_outcome(self, group_id: str, outcome: str, ttl_s: float) -> None: ...
    def invocation_record(self, group_id: str) -> tuple[str | None, str | None]: ...
    def wait_outcome(self, group_id: str, timeout_s: float) -> str | None: ...


class HedgeBudget(Protocol):
    def earn(self, n_requests: int = 1) -> None:
        """Credit ``n_requests`` admitted invocations: ``budget_ratio`` tokens each."""
        ...

    def plan_credit(self) -> tuple[float, int] | None:
        """(one invocation's credit, the budget hash's TTL in ms) for the store's planning
        read to add in its round trip (RuntimeStore.read_for_plan); None: call earn()."""
        ...

    def try_spend(self, backups: int, llm_tokens: float) -> bool:
        """Pay for ``backups`` backups costing ``llm_tokens`` in total, or nothing."""
        ...

    def snapshot(self) -> BudgetSnapshot:
        """Current balances (LLM bucket refilled to now) and counters."""
        ...


class DelayWindow(Protocol):
    def record(self, role: str, latency_s: float) -> None:
        """Add one completed attempt's latency (seconds) to the role's window."""
        ...

    def delay_s(self, role: str) -> float:
        """The role's current hedge delay in seconds."""
        ...


class Dispatcher(Protocol):
    """Puts a member task on its zone's queue (Celery), or runs it in-process."""

    def send(self, zone: str, task: MemberTask) -> None: ...
    def send_many(
        self, items: Sequence[tuple[str, MemberTask]], opening: GroupOpening | None = None
    ) -> None:
        """Each (zone, task) of ``items``, in order, as :meth:`send` would; at once where
        the backend can (one broker round trip for a group's initial members). With
        ``opening``, the group is opened before any of them can start: in that same
        round trip where the backend can, else by ``opening.open()`` first."""
        ...
