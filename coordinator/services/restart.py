"""Restart delays for supervised processes: a pure policy on an injected clock (the
watchdog, :mod:`coordinator.services.watchdog`, carries it out)."""

from __future__ import annotations

import contextlib
import enum
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from coordinator.config import HacoSettings


@dataclass(frozen=True)
class RestartPolicy:
    """When to restart a dead child (the settings ``supervise_*`` explain the defaults)."""

    initial_delay_s: float = 0.5
    max_delay_s: float = 30.0
    stable_s: float = 60.0
    max_restarts: int = 10
    factor: float = 2.0

    @classmethod
    def from_settings(cls, settings: HacoSettings) -> RestartPolicy:
        return cls(
            initial_delay_s=settings.supervise_initial_delay_s,
            max_delay_s=settings.supervise_max_delay_s,
            stable_s=settings.supervise_stable_s,
            max_restarts=settings.supervise_max_restarts,
        )

    def delay(self, crashes: int) -> float:
        """The wait before restarting after the ``crashes``-th crash in a row (from 1)."""
        exponent = min(max(crashes - 1, 0), 64)  # no float overflow however long the loop
        return min(self.max_delay_s, self.initial_delay_s * self.factor**exponent)


class Phase(enum.StrEnum):
    RUNNING = "running"
    WAITING = "waiting"  # dead, its restart due at Backoff.due_at
    GIVEN_UP = "given_up"  # crashed max_restarts times in a row: left for a person


@dataclass
class Backoff:
    """One child's restart state machine; time only from ``clock`` (monotonic seconds).
    ``died`` → WAITING (or GIVEN_UP), ``due`` once the delay has passed, ``restarted`` →
    RUNNING. A failed restart counts as another crash: call ``died`` again."""

    policy: RestartPolicy
    clock: Callable[[], float] = time.monotonic
    started_at: float = field(init=False)
    crashes: int = 0  # in a row, each within policy.stable_s of its start
    restarts: int = 0
    due_at: float | None = None
    phase: Phase = Phase.RUNNING

    def __post_init__(self) -> None:
        self.started_at = self.clock()

    def died(self) -> float | None:
        """Record a death; the delay before the restart, or None: given up."""
        now = self.clock()
        if now - self.started_at >= self.policy.stable_s:
            self.crashes = 0  # it had been healthy: a fresh crash, not a loop
        self.crashes += 1
        if self.crashes > self.policy.max_restarts:
            self.phase, self.due_at = Phase.GIVEN_UP, None
            return None
        delay = self.policy.delay(self.crashes)
        self.phase, self.due_at = Phase.WAITING, now + delay
        return delay

    def due(self) -> bool:
        due_at = self.due_at
        return self.phase is Phase.WAITING and due_at is not None and self.clock() >= due_at

    def restarted(self) -> None:
        self.restarts += 1
        self.started_at, self.phase, self.due_at = self.clock(), Phase.RUNNING, None


def exit_reason(returncode: int | None) -> str:
    if returncode is None:
        return "died (exit status unknown: not our child)"
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
        return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"
