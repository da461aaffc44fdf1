"""How early a backup's timer runs: this process's own path from a timer to a send.

A staggered backup is due when its hedge delay expires (coordinator.core.stagger). The
runtime then needs time of its own before the backup's message is on its way: the timer
thread's wake-up, the wake token's trip through Redis to the caller blocked on the
group's reply list (Redis checks a blocked pop's own timeout only at its clock tick, so
the token is what wakes it), the caller's tick and the budget's round trip.
``python -m bench.launchlag`` splits that path: 1.3 ms at p50 on the project's 2-core
machine, about 1.5% of the tail bench's p99.

The path is much the same for every backup a process launches, so the timer runs early
by its recent median (the launcher's ``lead_s``): the send then lands on the delay the
policy chose instead of one wake-up path after it. Per process, as the queue waits are
(coordinator.runtime.liveness): it costs no round trip, and the path is this process's
own. Capped (``HacoSettings.launch_lead_max_s``): a longer path is a stalled process,
not the timer's; and a delay of seconds, an LLM call's, hardly notices a lead anyway.
"""

from __future__ import annotations

import math
import threading

from coordinator.config import HacoSettings
from coordinator.core.percentiles import RankedWindow, nearest_rank


class LaunchLead:
    """The median of the last ``window`` paths (s) from a backup's timer to its send,
    once ``min_samples`` are in (0 before), capped at ``max_s`` (0: no lead)."""

    def __init__(self, window: int, min_samples: int, max_s: float) -> None:
        if min_samples < 1:
            raise ValueError(f"min_samples={min_samples!r}; expected at least 1")
        if not 0.0 <= max_s < math.inf:
            raise ValueError(f"max_s={max_s!r}; expected a finite number >= 0")
        self._paths = RankedWindow(window)
        self._min_samples = min_samples
        self._max_s = max_s
        self._lock = threading.Lock()

    @classmethod
    def of(cls, s: HacoSettings) -> LaunchLead:
        return cls(s.launch_lead_window, s.launch_lead_min_samples, s.launch_lead_max_s)

    def record(self, path_s: float) -> None:
        """One backup's path; a non-finite or negative one (a clock step) is ignored."""
        if not math.isfinite(path_s) or path_s < 0.0 or self._max_s == 0.0:
            return
        with self._lock:
            self._paths.add(path_s)

    def lead_s(self) -> float:
        with self._lock:
            if len(self._paths) < self._min_samples:
                return 0.0
            return min(nearest_rank(self._paths, 50.0), self._max_s)

    def __len__(self) -> int:
        with self._lock:
            return len(self._paths)
