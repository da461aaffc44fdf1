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
    """Lifecycle of a hedge group in the coordinator."""

    PLANNED = "planned"  # members chosen, nothing launched yet
    RUNNING = "running"  # at least one member launched, no verdict yet
    WON = "won"  # a winner was declared
    ALL_FAILED = "all_failed"  # every member failed
    DEADLINE = "deadline"  # the deadline passed with no success


class FailureKind(StrEnum):
    INTERNAL = "internal"  # the service itself failed (errors, its own timeouts)
    NETWORK = "network"  # the transmission was lost or timed out on the link
    DEADLINE = "deadline"  # the group deadline passed before the member reported
    CANCELLED = "cancelled"
