"""The one way tests wait for something another process or thread does: poll a probe.

A probe returns a falsy value (None, False, 0, an empty collection) while the thing has
not happened, and anything truthy once it has; :func:`wait_for` returns that value. The
timeout only bounds a failing test (it fails with what it waited for); it is never a
measurement, and tests assert on what happened, not on how long it took.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

INTERVAL_S = 0.05


def wait_for(
    what: str,
    probe: Callable[[], T],
    timeout_s: float = 60.0,
    interval_s: float = INTERVAL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] = time.sleep,
) -> T:
    """Call ``probe`` every ``interval_s`` until it returns something truthy, and return
    that; AssertionError naming ``what`` after ``timeout_s``. The probe runs at least
    once, and once more after the deadline, so a slow machine fails only when the thing
    really did not happen. ``clock`` and ``sleep`` are injectable."""
    deadline = clock() + timeout_s
    while True:
        expired = clock() > deadline
        got = probe()
        if got:
            return got
        if expired:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        sleep(interval_s)
