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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from coordinator.errors import PolicyError
from schemas.enums import LaunchMode


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
        self.launched = 0
        self.last_launch_s = start_s
        self.replacements = 0  # failures not yet answered by a replacement launch
        self.timer_on = True  # off after the budget refused a backup, until a failure
        self.succeeded = False

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
        return self.last_launch_s + self.delay_s

    @property
    def pending(self) -> bool:
        """Whether members not yet launched may still be launched."""
        return self.launched < self.size and not self.succeeded
