"""When the coordinator stops waiting for a member (issue 8, "a zone that goes dark").

Pure bookkeeping over an injected clock, like :mod:`coordinator.core.stagger`: the
runtime tells a :class:`Watch` when members were launched, when their workers said they
started, and when they reported; it asks :meth:`Watch.due` which members to give up on
now and :meth:`Watch.wake_at` when to ask again. Nothing here sleeps, reads a clock or
talks to Redis.

A launched member is *given up* (treated as failed by the winner rule, and answered by
a replacement launch under ``staggered``) when

- it has not started ``start_timeout_s`` after its launch: its zone's queue is not being
  consumed (the zone went dark, or is far more loaded than it ever was); or
- it started but has not reported ``patience_s`` after it started: the candidate hangs.

A report that arrives after a member was given up still counts (it replaces the
assumed failure, see :meth:`Watch.reports`). The two budgets:

- :func:`start_timeout_s`: ``max(min_s, factor × p95)`` of the queue waits observed for
  the zone (``min_s`` alone until there are enough of them);
- :func:`patience_s`: ``max(min_s, factor × t_proc)``, ``t_proc`` the candidate's
  expected processing latency in wall-clock seconds (the policy's ``t_proc``: its own
  mean, else the pool's median, else the cold-start value).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from coordinator.core.percentiles import RankedWindow, nearest_rank
from coordinator.core.winner import Report
from coordinator.errors import PolicyError


class GaveUp(StrEnum):
    NOT_STARTED = "not_started"  # no worker took it within the start timeout
    NO_REPORT = "no_report"  # started, but no report within the patience


def start_timeout_s(
    min_s: float,
    factor: float,
    waits_s: Sequence[float] | RankedWindow,
    min_samples: int,
    pct: float = 95.0,
) -> float:
    """The start timeout of a zone given its recently observed queue waits."""
    if len(waits_s) < min_samples:
        return min_s
    return max(min_s, factor * nearest_rank(waits_s, pct))


def patience_s(min_s: float, factor: float, t_proc_s: float) -> float:
    """How long a started member is waited for before the best success in hand wins."""
    if not t_proc_s >= 0.0:
        raise PolicyError(f"t_proc_s={t_proc_s!r}; expected a latency >= 0")
    return max(min_s, factor * t_proc_s)


@dataclass(frozen=True, slots=True)
class Budgets:
    """One member's two budgets, seconds."""

    start_s: float
    patience_s: float


class Watch:
    """The give-up clocks of one group's members (indexed by rank)."""

    def __init__(self, budgets: Sequence[Budgets]) -> None:
        if not budgets:
            raise PolicyError("a hedge group needs at least one member")
        n = len(budgets)
        self.budgets = list(budgets)
        self.launched_at: list[float | None] = [None] * n
        self.started_at: list[float | None] = [None] * n
        self.reported = [False] * n
        self.given_up: dict[int, tuple[GaveUp, float]] = {}  # rank -> (why, when)

    def on_launch(self, rank: int, now_s: float) -> None:
        self.launched_at[rank] = now_s

    def on_started(self, rank: int, now_s: float) -> float | None:
        """A worker started the member; returns its queue wait (None: already known, or
        never launched by this group)."""
        launched = self.launched_at[rank]
        if launched is None or self.started_at[rank] is not None:
            return None
        self.started_at[rank] = now_s
        if self.given_up.get(rank, (None,))[0] is GaveUp.NOT_STARTED:
            del self.given_up[rank]  # it did start: its patience clock runs from now
        return max(0.0, now_s - launched)

    def on_report(self, rank: int) -> None:
        self.reported[rank] = True
        self.given_up.pop(rank, None)

    def give_up_at(self, rank: int) -> float:
        """When the member is given up (inf: never, it reported or was not launched)."""
        launched = self.launched_at[rank]
        if launched is None or self.reported[rank]:
            return math.inf
        started, b = self.started_at[rank], self.budgets[rank]
        if started is None:
            return launched + b.start_s
        return started + b.patience_s

    def due(self, now_s: float) -> list[int]:
        """Members given up at ``now_s`` that were not given up before (each once per
        clock: a member given up as not started and then started may be given up again
        when its patience runs out)."""
        out = []
        for rank in range(len(self.budgets)):
            if rank in self.given_up or now_s < self.give_up_at(rank):
                continue
            why = GaveUp.NOT_STARTED if self.started_at[rank] is None else GaveUp.NO_REPORT
            self.given_up[rank] = (why, now_s)
            out.append(rank)
        return out

    def wake_at(self) -> float:
        """The next give-up time among members not given up yet; inf when none."""
        times = [self.give_up_at(r) for r in range(len(self.budgets)) if r not in self.given_up]
        return min(times, default=math.inf)

    def reports(self, reports: Sequence[Report | None], t0_s: float) -> list[Report | None]:
        """The winner rule's input: a given-up member without a report reads as a failure
        at the time it was given up (relative to the group start ``t0_s``). One that never
        started always does (it never will: its start was claimed); one that started and
        is merely slow only once a success is in hand — patience bounds the wait for a
        better-ranked member, it does not end a group that has nothing yet (that is the
        deadline's job)."""
        out = list(reports)
        in_hand = any(r is not None and r.success for r in reports)
        for rank, (why, at) in self.given_up.items():
            if rank >= len(out) or out[rank] is not None:
                continue
            if why is GaveUp.NOT_STARTED or in_hand:
                out[rank] = Report(max(0.0, at - t0_s), False)
        return out

    def started(self, rank: int) -> bool:
        return self.started_at[rank] is not None

    def gave_up_unstarted(self, rank: int) -> bool:
        """Given up as not started (and not started since): no outcome of its own."""
        return self.given_up.get(rank, (None,))[0] is GaveUp.NOT_STARTED
