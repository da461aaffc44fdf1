"""Percentiles and medians, each defined once (numpy underneath, no hand-written loops).

- :func:`nearest_rank`: the method's percentile (the hedge delay, the profiles' latency
  percentiles): an observed value, the smallest with at least p % of the values at or
  below it. It is ``np.percentile(values, p, method="inverted_cdf")`` but for float noise:
  numpy's ``n * p / 100`` can land just above a whole rank (28 % of 25 values gives rank 8
  there, not 7), so the rank is computed here, rounded, and the value picked by numpy.
- :class:`RankedWindow`: the last ``size`` values, kept sorted as they come (stdlib
  ``bisect`` beside a ``deque``), so that :func:`nearest_rank` of it is one index, not a
  partition of the whole window on every read: the coordinator reads its zones' start
  timeouts on every call and adds one queue wait per member.
- :func:`median`: the middle value, or the mean of the two middle ones; equal to
  ``np.median``, which costs about 9 µs where the allocation rule takes three medians of
  a handful of values on every decision: a Python sequence goes through the standard
  library's ``statistics.median`` (≈ 0.3 µs for six values), an array through numpy.
- :func:`lower` and :func:`interpolated`: numpy's ``lower`` and ``linear`` methods, for
  the benchmarks' summaries of measured times.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from coordinator.errors import InputError

Values = Sequence[float] | npt.NDArray[np.float64]


class RankedWindow:
    """The last ``size`` values added, in arrival order and in sorted order (not
    thread-safe: its owner locks). Non-finite values are refused: they have no rank."""

    __slots__ = ("_order", "_sorted", "size")

    def __init__(self, size: int) -> None:
        if size < 1:
            raise InputError(f"size={size!r}; expected a window of at least one value")
        self.size = size
        self._order: deque[float] = deque()
        self._sorted: list[float] = []

    def add(self, value: float) -> None:
        if not math.isfinite(value):
            raise InputError(f"value={value!r}; expected a finite number")
        if len(self._order) == self.size:
            old = self._order.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        self._order.append(value)
        bisect.insort(self._sorted, value)

    def __len__(self) -> int:
        return len(self._order)

    def ranked(self, rank: int) -> float:
        """The ``rank``-th smallest value (1-based)."""
        return self._sorted[rank - 1]


def nearest_rank(values: Values | RankedWindow, percentile: float) -> float:
    """The nearest-rank ``percentile`` (0 ≤ p ≤ 100; 0 gives the smallest value) of
    non-empty ``values``: the smallest value with at least p % of the values at or below
    it. 95 % of 20 values is the 19th smallest."""
    n = len(values)
    if n == 0:
        raise InputError("nearest_rank got no values; expected at least one")
    if not 0.0 <= percentile <= 100.0:
        raise InputError(f"percentile={percentile!r}; expected a number in [0, 100]")
    # Rounded first so that e.g. 95 % of 20 is rank 19, not 20 through float noise.
    rank = min(max(math.ceil(round(percentile * n / 100.0, 9)), 1), n)
    if isinstance(values, RankedWindow):
        return values.ranked(rank)
    return float(np.partition(np.asarray(values, dtype=float), rank - 1)[rank - 1])


def median(values: Values, default: float | None = None) -> float:
    """The median of ``values`` (as ``np.median``); ``default`` when there are none."""
    if len(values) == 0:
        if default is None:
            raise InputError("median got no values and no default; expected at least one")
        return default
    if not isinstance(values, np.ndarray):
        return float(statistics.median(values))
    ordered = np.sort(values.astype(float, copy=False))
    mid = ordered.shape[0] // 2
    if ordered.shape[0] % 2:
        return float(ordered[mid])
    return 0.5 * float(ordered[mid - 1] + ordered[mid])


def lower(values: Values, percentile: float) -> float:
    """numpy's ``lower`` percentile: the value at index ⌊p/100 · (n − 1)⌋ of the sorted
    values (no interpolation)."""
    return float(np.percentile(np.asarray(values, dtype=float), percentile, method="lower"))


def interpolated(values: Values, *percentiles: float) -> list[float]:
    """numpy's default (linear) percentiles of ``values``; NaN for each when empty."""
    if len(values) == 0:
        return [math.nan] * len(percentiles)
    arr = np.asarray(values, dtype=float)
    return [float(v) for v in np.percentile(arr, percentiles)]
