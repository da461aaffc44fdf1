"""Lifecycle and mode enums.

The string values are the wire and storage format; later SQL migrations mirror them in
CHECK constraints, so renaming a value is a schema change.
"""

from __future__ import annotations

from enum import StrEnum


class LaunchMode(StrEnum):
    PARALLEL = "parallel"  # every member starts at once (HACO as published)
    STAGGERED = "staggered"  # backups start after the hedge delay or on a failure


class WinnerMode(StrEnum):
    RANKED = "ranked"  # the paper's rule: best-ranked success once all above it reported
    FIRST = "first"  # first success wins
    BEST = "best"  # wait for all (or the deadline), highest judged quality wins


class StopReason(StrEnum):
    TARGET_REACHED = "target_reached"
    POOL_EXHAUSTED = "pool_exhausted"
    # Shared failure causes alone cap P_succ below τ: no set of any size reaches it.
    TARGET_UNREACHABLE = "target_unreachable"
    SINGLE_ROUTE = "single_route"  # a baseline that never accumulates reliability
    FULL_POOL = "full_pool"  # MoA: the whole pool by construction


class MemberStatus(StrEnum):
    QUEUED = "queued"  # enqueued on its zone's queue, not yet picked up
    RUNNING = "running"  # a worker is calling the backend
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


class GroupState(StrEnum):
    """Lifecycle of a hedge group in the coordinator: its verdict, as ``invocations.state``
    stores it (a row is ``running`` from its first harvested member until its verdict)."""

    PLANNED = "planned"  # members chosen, nothing launched yet
    RUNNING = "running"  # at least one member launched, no verdict yet
    WON = "won"  # a winner was declared
    ALL_FAILED = "all_failed"  # every member failed
    DEADLINE = "deadline"  # the deadline passed with no success

    @property
    def final(self) -> bool:
        """A verdict: the group is decided and closed."""
        return self not in (GroupState.PLANNED, GroupState.RUNNING)


class GroupSignal(StrEnum):
    """What a group's members read from its state key (``keys.group_state``): whether to
    start, or go on. Not :class:`GroupState`: the verdict does not say it — a WON group
    keeps its losers running (RESOLVED) or stops them (CANCELLED, ``cancel_losers``), and
    a group with no verdict yet is OPEN whether it is planned or running. The coordinator
    derives the signal from the verdict and the policy when it closes the group."""

    OPEN = "open"  # members may start and run
    RESOLVED = "resolved"  # a verdict is known; running members finish (for harvesting)
    CANCELLED = "cancelled"  # members must not start, and stop at their next check


class FailureKind(StrEnum):
    INTERNAL = "internal"  # the service itself failed (errors, its own timeouts)
    NETWORK = "network"  # the transmission was lost or timed out on the link
    DEADLINE = "deadline"  # the group deadline passed before the member reported
    CANCELLED = "cancelled"  # stopped, or never started: its group was cancelled or gone
    # The call succeeded, but another member already held the invocation's idempotency
    # key: its side effect was not committed and its output is not the group's.
    IDEMPOTENCY_TAKEN = "idempotency_taken"
    # Failures of a real model endpoint (workers.backends.openai). All of them are the
    # service's own failures and count towards f_int (coordinator.core.observations);
    # transport failures (refused, reset, DNS, connect timeout) are NETWORK.
    RATE_LIMITED = "rate_limited"  # HTTP 429 (its Retry-After becomes a cooldown)
    SERVER_ERROR = "server_error"  # HTTP 5xx, or another non-success status
    TIMEOUT = "timeout"  # no headers or no progress within the read/total timeout
    INVALID_RESPONSE = "invalid_response"  # not the protocol: bad JSON, no choices
    CONTENT_FILTERED = "content_filtered"  # refused by the provider's content filter
