"""One timer thread per process for every group's wake-ups.

A coordinator arms a wake-up per group whenever a launch timer or a member's patience
runs out before the deadline (:class:`coordinator.runtime.group.Alarm`). A
``threading.Timer`` per alarm starts a thread per group, and starting one waits until
the new thread runs: on a busy 2-core machine that is a scheduling delay on every call.
:class:`Timers` keeps the due actions in a heap served by one daemon thread, started on
first use (no import-time side effects); an action runs on that thread, so it must be
short (a wake token pushed to Redis).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)
Action = Callable[[], None]


class Handle:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True  # the thread skips it when it comes due


class Timers:
    """``resolution_s`` > 0 rounds due times up to its multiples, so actions due close
    together (and cancelled ones, which are dropped when due) share one wake-up."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, resolution_s: float = 0.0
    ) -> None:
        self._clock = clock
        self._resolution_s = resolution_s
        self._heap: list[tuple[float, int, Handle, Action]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def schedule(self, delay_s: float, action: Action) -> Handle:
        """Run ``action`` on the timer thread ``delay_s`` from now (unless cancelled)."""
        handle = Handle()
        with self._cond:
            at = self._clock() + max(0.0, delay_s)
            if self._resolution_s > 0:
                at = math.ceil(at / self._resolution_s) * self._resolution_s
            earliest = not self._heap or at < self._heap[0][0]
            heapq.heappush(self._heap, (at, next(self._seq), handle, action))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="haco-timers", daemon=True)
                self._thread.start()
            if earliest:  # else the thread already wakes in time: no switch to it
                self._cond.notify()
        return handle

    def _next(self) -> Action | None:
        """The next due action (None: its handle was cancelled), waiting for it."""
        with self._cond:
            while True:
                if not self._heap:
                    self._cond.wait()
                    continue
                at, _, handle, action = self._heap[0]
                left = at - self._clock()
                if left > 0:
                    self._cond.wait(left)
                    continue
                heapq.heappop(self._heap)
                return None if handle.cancelled else action

    def _run(self) -> None:
        while True:
            action = self._next()
            if action is None:
                continue
            try:
                action()
            except Exception:  # a lost wake-up is covered by the pop's own timeout
                log.exception("a group's wake-up failed")


TIMERS = Timers()  # the process's timer thread (started by the first schedule)
# Workers' start notices (workers.startnotice): tens of ms, most cancelled; 10 ms ticks.
COARSE_TIMERS = Timers(resolution_s=0.01)
