"""When to launch the next member of a hedge set (spec ``hedging.md``, launch modes).

Pure bookkeeping over an injected clock: the runtime asks :meth:`Launcher.due` what to
launch now and :meth:`Launcher.wake_at` when to ask again, and tells it about launches
and failures. Nothing here sleeps, reads a clock or talks to Redis.

- ``parallel``: every member at once. They are the reliability floor HACO needs to
  reach τ, so none is charged to the hedge budget.
- ``staggered``: the best-ranked member at once; the next one when the hedge delay
  expires with no success yet (a *backup*: it needs a budget token, and when the bucket
  is empty the timer is ignored), or at once, uncharged, when a launched member fails
  (a *replacement*: the set falls back to its floor).

A backup's timer may run ``lead_s`` early: the runtime's own path from a timer's wake-up
to the backup's send (its wake token, the budget's round trip: measured per process,
coordinator.runtime.lead), so that the send lands on the hedge delay, not that much
after it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from coordinator.core.winner import Report, verdict
from coordinator.errors import PolicyError
from schemas.enums import LaunchMode, WinnerMode


class LaunchReason(StrEnum):
    INITIAL = "initial"  # part of the launch at t = 0
    BACKUP = "backup"  # the hedge delay expired with no success (charged)
    REPLACEMENT = "replacement"  # an earlier member failed (uncharged)


@dataclass(frozen=True, slots=True)
class Launch:
    rank: int
    reason: LaunchReason

    @property
    def charged(self) -> bool:
        return self.reason is LaunchReason.BACKUP


class Launcher:
    def __init__(self, mode: LaunchMode, size: int, delay_s: float, start_s: float) -> None:
        if size < 1:
            raise PolicyError(f"size={size}; a hedge group needs at least one member")
        self.mode = mode
        self.size = size
        self.delay_s = delay_s
        # The timer's lead (s): a backup is due this much before its delay expires. Set
        # by the runtime; at most the delay (a backup never goes before its predecessor).
        self.lead_s = 0.0
        self.launched = 0
        self.last_launch_s = start_s
        self.replacements = 0  # failures not yet answered by a replacement launch
        self.timer_on = True  # off after the budget refused a backup, until a failure
        self.succeeded = False

    @property
    def timed(self) -> bool:
        """Whether a hedge timer can launch a member (it needs the hedge delay)."""
        return self.mode is LaunchMode.STAGGERED and self.size > 1

    def initial(self) -> list[Launch]:
        n = self.size if self.mode is LaunchMode.PARALLEL else 1
        return [Launch(r, LaunchReason.INITIAL) for r in range(n)]

    def on_launch(self, launch: Launch, now_s: float) -> None:
        self.launched = max(self.launched, launch.rank + 1)
        self.last_launch_s = now_s
        if launch.reason is LaunchReason.REPLACEMENT:
            self.replacements -= 1

    def on_report(self, success: bool) -> None:
        if success:
            self.succeeded = True
        elif self.launched < self.size:
            self.replacements += 1
            self.timer_on = True

    def on_budget_refused(self) -> None:
        self.timer_on = False

    def due(self, now_s: float) -> Launch | None:
        """The launch due at ``now_s``, if any (call again after acting on it)."""
        if self.launched >= self.size or self.succeeded:
            return None
        if self.replacements > 0:
            return Launch(self.launched, LaunchReason.REPLACEMENT)
        if self.mode is LaunchMode.STAGGERED and self.timer_on and now_s >= self._timer_s():
            return Launch(self.launched, LaunchReason.BACKUP)
        return None

    def wake_at(self) -> float:
        """When the next timer-driven launch is due; inf when none can be."""
        if (
            self.mode is LaunchMode.PARALLEL
            or self.launched >= self.size
            or self.succeeded
            or not self.timer_on
        ):
            return math.inf
        return self._timer_s()

    def _timer_s(self) -> float:
        return self.last_launch_s + self.delay_s - min(max(self.lead_s, 0.0), self.delay_s)

    @property
    def pending(self) -> bool:
        """Whether members not yet launched may still be launched."""
        return self.launched < self.size and not self.succeeded


# -- a whole staggered group, replayed from known outcomes (the simulator) ------------


@dataclass(frozen=True, slots=True)
class Attempt:
    """One member's outcome, known in advance: how long from its launch to its report,
    whether it succeeded, and its judged quality (the ``best`` rule)."""

    duration_s: float
    success: bool
    quality: float | None = None


@dataclass(frozen=True, slots=True)
class Schedule:
    """How a staggered group played out, per rank and relative to the group start."""

    launch_s: tuple[float | None, ...]  # None: never launched
    reasons: tuple[LaunchReason | None, ...]
    late: tuple[bool, ...]  # launched, and reporting after the deadline
    winner: int | None  # None: every launched member failed (or timed out)
    at_s: float  # when the group was decided

    @property
    def launched(self) -> int:
        return sum(t is not None for t in self.launch_s)

    def running_at_resolution(self, attempts: Sequence[Attempt]) -> tuple[int, ...]:
        """Ranks launched but not reported when the group was decided (what a
        ``cancel_losers`` group cancels)."""
        return tuple(
            k
            for k, t in enumerate(self.launch_s)
            if t is not None and t + attempts[k].duration_s > self.at_s
        )


def schedule(
    mode: WinnerMode,
    attempts: Sequence[Attempt],
    delays_s: Sequence[float],
    deadline_s: float = math.inf,
) -> Schedule:
    """Replay a ``staggered`` group whose members' outcomes are known.

    Rank 0 starts at t = 0. While no member has succeeded and the deadline has not
    passed, the next rank starts

    - at once when every launched member has reported a failure (a *replacement*);
    - when ``delays_s[k]`` has passed since rank k, the last one launched, started (a
      *backup*); ``delays_s`` holds at least one delay per rank but the last.

    No member starts at or after the deadline, nor after a success. A report after the
    deadline is a failure at the deadline (:func:`coordinator.core.winner.resolve`).
    The winner rule (:func:`coordinator.core.winner.verdict`) looks at the launched
    members only: ranks start in order, so a member never launched ranks below every
    launched one and blocks nothing. A verdict without a winner is final only once no
    further member can start. Reports at the same instant are taken together, before a
    backup due at that instant (a success at the timer's expiry stops the backup).
    With every delay 0 this is the ``parallel`` launch (every rank at t = 0) and
    equals :func:`resolve`.

    Unlike :class:`Launcher` (one delay, a replacement for *every* failure, a hedge
    budget), a replacement here waits until every launched member has failed, and the
    timer is never refused: the simulator has no fleet-wide budget.
    """
    n = len(attempts)
    if n == 0:
        raise PolicyError("no attempts; a hedge group needs at least one member")
    if len(delays_s) < n - 1:
        raise PolicyError(f"{len(delays_s)} delays for {n} members; expected at least {n - 1}")
    if any(not d >= 0.0 for d in delays_s[: n - 1]):
        raise PolicyError(f"delays_s={list(delays_s)!r}; expected non-negative delays")
    g = _Replay(attempts, delays_s, deadline_s)
    while True:
        g.launch_due()
        t_report, t_timer = g.next_report_s(), g.next_timer_s()
        if t_report == math.inf and t_timer == math.inf:  # unreachable: decided below
            return g.result(None)
        if t_timer < t_report:
            g.now = t_timer
            continue
        g.take_reports(t_report)
        v = verdict(mode, g.reports[: g.launched])
        if v.decided and (v.winner is not None or not g.may_launch()):
            return g.result(v.winner)


class _Replay:
    """The state of :func:`schedule`'s replay at virtual time ``now``."""

    def __init__(
        self, attempts: Sequence[Attempt], delays_s: Sequence[float], deadline_s: float
    ) -> None:
        n = len(attempts)
        self.attempts = attempts
        self.delays_s = delays_s
        self.deadline_s = deadline_s
        self.launch: list[float | None] = [0.0] + [None] * (n - 1)
        self.reasons: list[LaunchReason | None] = [LaunchReason.INITIAL] + [None] * (n - 1)
        self.reports: list[Report | None] = [None] * n
        self.launched = 1
        self.succeeded = False
        self.now = 0.0

    def finish(self, k: int) -> float:
        return self.start_s(k) + self.attempts[k].duration_s

    def may_launch(self) -> bool:
        return (
            self.launched < len(self.attempts) and not self.succeeded and self.now < self.deadline_s
        )

    def timer_s(self) -> float:
        return self.start_s(self.launched - 1) + self.delays_s[self.launched - 1]

    def start_s(self, k: int) -> float:
        t = self.launch[k]
        assert t is not None
        return t

    def launch_due(self) -> None:
        while self.may_launch():
            if all(self.reports[k] is not None for k in range(self.launched)):
                why = LaunchReason.REPLACEMENT  # every launched member failed
            elif self.now >= self.timer_s():
                why = LaunchReason.BACKUP
            else:
                return
            self.launch[self.launched], self.reasons[self.launched] = self.now, why
            self.launched += 1

    def pending(self) -> list[int]:
        return [k for k in range(self.launched) if self.reports[k] is None]

    def next_report_s(self) -> float:
        return min((min(self.finish(k), self.deadline_s) for k in self.pending()), default=math.inf)

    def next_timer_s(self) -> float:
        if not self.may_launch():
            return math.inf
        t = self.timer_s()
        return t if t < self.deadline_s else math.inf

    def take_reports(self, now: float) -> None:
        """Every report due at ``now``; a member due after the deadline times out then."""
        self.now = now
        for k in self.pending():
            f = self.finish(k)
            if f > self.deadline_s:
                if now >= self.deadline_s:
                    self.reports[k] = Report(self.deadline_s, False, None)
            elif f == now:
                a = self.attempts[k]
                self.reports[k] = Report(f, a.success, a.quality)
                self.succeeded = self.succeeded or a.success

    def result(self, winner: int | None) -> Schedule:
        late = tuple(
            t is not None and t + a.duration_s > self.deadline_s
            for t, a in zip(self.launch, self.attempts, strict=True)
        )
        return Schedule(tuple(self.launch), tuple(self.reasons), late, winner, self.now)
