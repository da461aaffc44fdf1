"""Closing a hedge group: what a close writes, its limits and its result, and the close a
member's own report can make.

A group is closed once (``close_group.lua``, the function in ``group_close.lua``): the
winner claim, the members' signal, the operator counters and the verdict record, in one
atomic step. Its coordinator makes the close (:meth:`RedisStore.close_group`), except in
a group whose outcome its first report decides (a *staged close*, HacoSettings.
close_in_report): there each member carries its group's close should it win
(``schemas.models.StagedClose``), and its report script (``member_report.lua``) makes
it when the report is the group's first and a success. The script then pushes
:func:`closed_token` on the group's reply list ahead of the report, so the coordinator
learns it was closed without a round trip of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from coordinator.state.codec import rank_token
from schemas.enums import GroupSignal

CLOSED_PREFIX = "closed:"


def closed_token(rank: int) -> str:
    """The reply-list entry a member's report script pushes when its report closed the
    group with that member as the winner (a staged close)."""
    return f"{CLOSED_PREFIX}{rank}"


def parse_closed(raw: str) -> int | None:
    """The winner's rank of a closed token, None for anything else."""
    return rank_token(CLOSED_PREFIX, raw)


@dataclass(frozen=True, slots=True)
class GroupClose:
    """What closing a group writes: the members' signal, the winner claim (None: no
    winner), the operator counters and the verdict record (``GroupVerdict`` JSON, appended
    to the trace stream for the harvester)."""

    group_id: str
    signal: GroupSignal
    winner_member: str | None
    counts: Mapping[str, int]
    verdict: str


@dataclass(frozen=True, slots=True)
class CloseLimits:
    """TTLs and the stream cap a group is closed with (HacoSettings')."""

    group_ttl_s: float
    metrics_ttl_s: float
    trace_maxlen: int
    trace_ttl_s: float


@dataclass(frozen=True, slots=True)
class GroupClosed:
    """The result of a close: ``applied`` when this call closed the group (False: it was
    closed before, and nothing was written), and the winner it was closed with (None:
    none)."""

    applied: bool
    winner_member: str | None
