"""The in-memory runtime store: the same semantics as :class:`coordinator.state.store.
RedisStore` in one process, for single-process runs and as the second backend every
store test runs through."""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence

from coordinator.core.cofailure import CoFailure, Dependence
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
from coordinator.state import keys
from coordinator.state.closing import CloseLimits, GroupClose, GroupClosed
from coordinator.state.memberops import MemberOutcome, MemberStart, OutcomeLimits, Started
from coordinator.state.profilecache import PlanRead
from schemas.enums import GroupSignal


class MemoryStore:
    """In-process backend with the same semantics, for single-process runs and tests.
    TTLs are recorded, not enforced (but a cooldown's, on ``clock``): nothing outlives
    the process anyway. The trace stream's two kinds of entries are two lists: ``traces``
    (member reports) and ``verdicts`` (closed groups); nothing harvests them."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Condition()
        self.clock = clock  # cooldowns expire on it (the only TTL enforced here)
        self.cooldowns: dict[str, float] = {}  # candidate id -> when its cooldown ends
        self.states: dict[str, GroupSignal] = {}
        self.replies: dict[str, deque[str]] = defaultdict(deque)
        self.winners: dict[str, str] = {}
        self.claims: dict[str, str | None] = {}  # closed groups: their winner (None: none)
        self.chunks: dict[str, list[dict[str, str]]] = {}  # keys.member_chunks: entries
        self.idem: dict[str, str] = {}
        self.candidates: dict[str, CandidateProfile] = {}
        self.links: dict[str, LinkProfile] = {}
        self.cofailure: CoFailure | None = None
        self.domains: Mapping[str, Dependence | None] = {}
        self.traces: list[str] = []
        self.verdicts: list[str] = []
        self.counters: dict[str, int] = {}
        self.judged: dict[str, dict[str, float | None]] = {}  # keys.group_judged
        self.reports_seen: dict[str, int] = {}  # keys.group_reports: a staged group's reports
        self._on_cancel: list[Callable[[str], None]] = []  # as keys.CANCELLED subscribers
        # Submitted invocations (keys.invocation_accepted / _result): (value, expires at)
        # on ``clock``, the TTL enforced as for cooldowns.
        self.phases: dict[str, tuple[str, float]] = {}
        self.outcomes: dict[str, tuple[str, float]] = {}

    def on_cancel(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(group_id)`` whenever a group's signal becomes cancelled (the
        twin of RedisStore's PUBLISH on keys.CANCELLED; MemoryCancelWatcher subscribes)."""
        with self._lock:
            self._on_cancel.append(listener)

    def _publish_cancel(self, group_id: str) -> None:
        with self._lock:
            listeners = list(self._on_cancel)
        for listener in listeners:  # outside the lock, as a subscriber runs elsewhere
            listener(group_id)

    def set_invocation_phase(self, group_id: str, phase: str, ttl_s: float) -> None:
        with self._lock:
            self.phases[group_id] = (phase, self.clock() + ttl_s)

    def save_outcome(self, group_id: str, outcome: str, ttl_s: float) -> None:
        with self._lock:
            self.outcomes[group_id] = (outcome, self.clock() + ttl_s)
            self._lock.notify_all()

    def _live(self, table: dict[str, tuple[str, float]], group_id: str) -> str | None:
        value, ends = table.get(group_id, (None, 0.0))
        return value if ends > self.clock() else None

    def invocation_record(self, group_id: str) -> tuple[str | None, str | None]:
        with self._lock:
            return self._live(self.phases, group_id), self._live(self.outcomes, group_id)

    def wait_outcome(self, group_id: str, timeout_s: float) -> str | None:
        end = time.monotonic() + max(0.0, timeout_s)
        with self._lock:
            while (found := self._live(self.outcomes, group_id)) is None:
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self._lock.wait(left)
            return found

    def open_group(self, group_id: str, ttl_s: float) -> None:
        with self._lock:
            self.states[group_id] = GroupSignal.OPEN

    def group_state(self, group_id: str) -> GroupSignal | None:
        with self._lock:
            return self.states.get(group_id)

    def set_group_state(self, group_id: str, signal: GroupSignal, ttl_s: float) -> None:
        with self._lock:
            self.states[group_id] = signal
        if signal is GroupSignal.CANCELLED:
            self._publish_cancel(group_id)

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

    def pop_replies(self, group_id: str, timeout_s: float, max_n: int) -> list[str]:
        first = self.pop_reply(group_id, timeout_s)
        if first is None:
            return []
        with self._lock:
            queue = self.replies[group_id]
            return [first, *(queue.pop() for _ in range(min(max_n - 1, len(queue))))]

    def claim_winner(self, group_id: str, member_id: str, ttl_s: float) -> bool:
        with self._lock:
            if group_id in self.claims:
                return False  # SET NX semantics: even the holder's second claim fails
            self.winners[group_id] = self.claims[group_id] = member_id
            return True

    def append_chunks(self, key: str, entries: list[dict[str, str]], ttl_s: float) -> None:
        with self._lock:
            self.chunks.setdefault(key, []).extend(entries)

    def stream_winner(self, group_id: str) -> str | None:
        return None  # no stream is relayed in process

    def claim_idempotency(self, key: str, member_id: str, ttl_s: float) -> str:
        with self._lock:
            return self.idem.setdefault(key, member_id)

    def claim_and_peek(self, key: str, member_id: str, ttl_s: float, peek: str) -> tuple[str, bool]:
        with self._lock:
            return self.idem.setdefault(key, member_id), peek in self.idem

    def set_cooldown(self, candidate_id: str, ttl_s: float, until_s: float) -> None:
        """As RedisStore.set_cooldown; the TTL is enforced on the injected clock."""
        with self._lock:
            ends = self.clock() + ttl_s
            self.cooldowns[candidate_id] = max(ends, self.cooldowns.get(candidate_id, ends))

    def cooling(self, candidate_ids: Sequence[str]) -> set[str]:
        with self._lock:
            now = self.clock()
            return {c for c in candidate_ids if self.cooldowns.get(c, now) > now}

    def record_judged(
        self, group_id: str, member_id: str, score: float | None, ttl_s: float
    ) -> None:
        with self._lock:
            self.judged.setdefault(group_id, {})[member_id] = score
            self.replies[group_id].appendleft(keys.WAKE)
            self._lock.notify_all()

    def judged_scores(self, group_id: str) -> dict[str, float | None]:
        with self._lock:
            return dict(self.judged.get(group_id, {}))

    def load_cofailure(self) -> CoFailure | None:
        """The co-failure evidence the in-process recompute stand-in set
        (:meth:`set_cofailure`); the Redis store's comes with the recompute's snapshot."""
        with self._lock:
            return self.cofailure

    def set_cofailure(self, evidence: CoFailure | None) -> None:
        with self._lock:
            self.cofailure = evidence

    def load_domains(self) -> Mapping[str, Dependence | None]:
        """The failure domains set with :meth:`set_domains`, by pool key (the Redis
        store's come with the recompute's snapshot)."""
        with self._lock:
            return self.domains

    def set_domains(self, published: Mapping[str, Dependence | None]) -> None:
        with self._lock:
            self.domains = published

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

    def apply_quality(
        self, candidate_id: str, q: float, settings: ProfileSettings, ttl_s: float, at_s: float
    ) -> None:
        with self._lock:
            prof = self.candidates.get(candidate_id) or CandidateProfile(candidate_id)
            self.candidates[candidate_id] = apply_quality(prof, q, settings, at_s)

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
        with self._lock:  # one lock: the same all-or-nothing as Redis' MULTI
            if cand_obs is not None:
                self.update_candidate(candidate_id, cand_obs, settings, limits.profile_ttl_s)
            if link_obs:
                self.update_link(link_id, src, dst, link_obs, settings, limits.profile_ttl_s)
            self.append_trace(report, limits.trace_maxlen, limits.trace_ttl_s)

    def read_for_plan(
        self,
        candidate_ids: Sequence[str],
        link_ids: Sequence[str],
        open_group: str | None = None,
        group_ttl_s: float = 0.0,
        credit: tuple[float, int] | None = None,
        fresh_s: float = 0.0,
    ) -> PlanRead:
        """As RedisStore.read_for_plan (coordinator.state.profilecache), in one lock; no
        budget lives here, so nothing is credited (the coordinator calls earn()). A read
        costs nothing here: the view is always read, whatever ``fresh_s``."""
        with self._lock:
            cands, links = self.load_profiles(candidate_ids, link_ids)
            cooling = self.cooling(candidate_ids)
            if open_group is not None:
                self.open_group(open_group, group_ttl_s)
            return PlanRead(cands, links, cooling, opened=open_group is not None)

    # The worker's hot path (coordinator.state.memberops): the same steps as the scripts.
    records_delays = False  # the in-process delay window is the worker's (MemberContext)

    def start_member(self, s: MemberStart) -> tuple[GroupSignal | None, Started]:
        with self._lock:
            state = self.states.get(s.group_id)
            if state is None or state is GroupSignal.CANCELLED or s.past_deadline:
                return state, Started.NOT_STARTED
            if self.idem.setdefault(s.start_claim, s.owner) != s.owner:
                return state, Started.DECLARED_LOST
            if s.started_token:
                self.push_reply(s.group_id, s.started_token, s.ttl_s)
            return state, Started.RUN

    def report_member(
        self, o: MemberOutcome, settings: ProfileSettings, limits: OutcomeLimits
    ) -> bool:
        closed = None
        with self._lock:
            if o.staged and self._count_report(o.group_id) == 1 and o.close is not None:
                close_limits = CloseLimits(
                    o.ttl_s, limits.profile_ttl_s, limits.trace_maxlen, limits.trace_ttl_s
                )
                if self._close(o.close, close_limits).applied:
                    closed = o.close
                    self.push_reply(o.group_id, o.closed_token, o.ttl_s)
            self.push_reply(o.group_id, o.report, o.ttl_s)
            recorded = o.harvest and self.idem.setdefault(o.outcome_claim, o.owner) == o.owner
            if recorded:
                self.record_outcome(
                    o.candidate_id, o.cand_obs, o.link_id, o.src, o.dst, o.link_obs, o.report,
                    settings, limits,
                )  # fmt: skip
        if closed is not None and closed.signal is GroupSignal.CANCELLED:
            self._publish_cancel(o.group_id)
        return recorded

    def _count_report(self, group_id: str) -> int:
        with self._lock:
            n = self.reports_seen[group_id] = self.reports_seen.get(group_id, 0) + 1
            return n

    def hold_close(self, group_id: str, ttl_s: float) -> None:
        self._count_report(group_id)

    def incr_metrics(self, counts: Mapping[str, int], ttl_s: float) -> None:
        with self._lock:
            for name, n in counts.items():
                self.counters[name] = self.counters.get(name, 0) + n

    def metrics(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counters)

    def close_group(self, close: GroupClose, limits: CloseLimits) -> GroupClosed:
        """As RedisStore.close_group's script: once per group, all or nothing."""
        closed = self._close(close, limits)
        if closed.applied and close.signal is GroupSignal.CANCELLED:
            self._publish_cancel(close.group_id)
        return closed

    def _close(self, close: GroupClose, limits: CloseLimits) -> GroupClosed:
        """The close's writes, under the lock (a cancel is published by the caller, outside
        it, as a subscriber runs elsewhere)."""
        g = close.group_id
        with self._lock:
            if g in self.claims:
                return GroupClosed(False, self.claims[g])
            self.claims[g] = close.winner_member
            if close.winner_member is not None:
                self.winners[g] = close.winner_member
            self.states[g] = close.signal
            self.incr_metrics(close.counts, limits.metrics_ttl_s)
            self.verdicts.append(close.verdict)
            del self.verdicts[: -limits.trace_maxlen]
        return GroupClosed(True, close.winner_member)
