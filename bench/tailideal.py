"""The ideal staggered launch: the zero-overhead launch the tail goal measures against.

A call's rank 0 runs its draw ``x0``; when ``x0`` outlasts the delay, a backup launched at
exactly the delay runs its own draw ``x1``, and the call takes whichever ends first. Two
ways to take the ideal's p99:

- **On the backend's distribution** (:func:`bench.rttail.oracle`): 400 000 draws, a curve
  over delay percentiles, read at a run's extra load. This is the goal's ideal. A run's
  p99 over 6 000 calls spreads around its own expectation: launched at the true p95 with
  no runtime at all, only 78% of 60 runs land within 1.05× of this ideal
  (``python -m bench.tailpolicy``).
- **On the run's own draws** (:func:`pair`, paired): each call's rank-0 draw and, where it
  ran, its backup's, launched at the delay that fires on the run's own extra load. The
  run and its ideal then share their draws, so the draws' sampling cancels in the ratio
  and what is left is the policy's and the runtime's cost. Shown beside the goal, not
  judged: the goal names the ideal on the distribution.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

BOOTSTRAP = 1000  # resamples of the calls for a p99's or a ratio's 90% interval

# n fresh backend draws (s): where the ideal launches a backup that the run did not.
Draws = Callable[[int], np.ndarray]


def staggered(x0: np.ndarray, x1: np.ndarray, delay_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Each call's latency under the ideal launch at ``delay_s``, and which calls fired a
    backup. ``x1`` is read only where a backup fires (elsewhere it may be NaN)."""
    fired = x0 > delay_s
    return np.where(fired, np.minimum(x0, delay_s + np.where(fired, x1, 0.0)), x0), fired


def delay_for_load(x0: np.ndarray, extra_load: float) -> float:
    """The delay at which the ideal fires a backup on ``extra_load`` of the calls: the
    draw below the round(extra_load × n) longest (ties aside, exactly that many outlast
    it). None at 0 (no delay ends); every one at 1 (a backup at once)."""
    n = len(x0)
    k = min(n, max(0, round(extra_load * n)))
    if n == 0 or k == 0:
        return math.inf
    if k == n:
        return 0.0
    return float(np.sort(x0)[n - k - 1])


@dataclass(frozen=True)
class Paired:
    """A run's calls beside their own ideal launch, call by call."""

    keep: np.ndarray  # which of the run's calls are paired; the rest have no rank-0 draw
    lat_s: np.ndarray  # each paired call's measured latency
    ideal_s: np.ndarray  # the same call under the ideal launch on its own draws
    delay_s: float  # the ideal's delay: it fires on the run's extra load
    filled: int  # backups the ideal fires that the run never ran: their draw is fresh
    x0_s: np.ndarray  # each paired call's rank-0 draw
    x1_s: np.ndarray  # its backup's draw where the run ran one, else NaN


def member_draw(ms: Sequence[dict[str, Any]], rank: int) -> float:
    """The backend's draw of the member of ``rank`` that ran to its end, else NaN."""
    for m in ms:
        if m["rank"] == rank and m["status"] == "succeeded" and m.get("proc_latency_s") is not None:
            return float(m["proc_latency_s"])
    return math.nan


def pair(
    calls: Sequence[tuple[str, float]],
    lat: Sequence[float],
    traces: dict[str, list[dict[str, Any]]],
    extra_load: float,
    fresh: Draws,
) -> Paired | None:
    """The run's calls (``calls``: group id and hedge delay, ``lat`` their latencies) with
    the ideal launch on their own draws (the traces' ``proc_latency_s``) at
    ``extra_load``. A backup the ideal fires whose draw the run never made (the run
    launched none for that call) takes a ``fresh`` draw: its draw is independent of rank
    0's, in the run as in the ideal. None: no call has rank 0's draw."""
    x0 = np.array([member_draw(traces.get(gid, []), 0) for gid, _ in calls], dtype=float)
    x1 = np.array([member_draw(traces.get(gid, []), 1) for gid, _ in calls], dtype=float)
    keep = ~np.isnan(x0)
    if not keep.any():
        return None
    x0, ran = x0[keep], x1[keep]
    delay_s = delay_for_load(x0, extra_load)
    missing = (x0 > delay_s) & np.isnan(ran)
    x1 = ran.copy()
    x1[missing] = fresh(int(missing.sum()))
    ideal, _ = staggered(x0, x1, delay_s)
    return Paired(
        keep=keep,
        lat_s=np.asarray(lat, dtype=float)[keep],
        ideal_s=ideal,
        delay_s=delay_s,
        filled=int(missing.sum()),
        x0_s=x0,
        x1_s=ran,
    )


def policy_split(
    calls: list[tuple[str, float]],
    unpaid: np.ndarray,
    got: Paired,
    extra_load: float,
    fresh: Draws,
) -> dict[str, float]:
    """The policy's share without the members' own overhead and without the budget.
    ``draws_over``: the run's own delays and backups on the backend's draws, over the
    paired ideal. ``draws_paid_over``: the same with every refused backup (``unpaid``)
    paid, launched at its call's delay on a ``fresh`` draw, over the ideal at the extra
    load they make (``paid_extra_load``), on the same fresh draws: what is left is the
    delay's estimate. Held to the ideal at the run's own load, they would flatter it."""
    x0, x1 = got.x0_s, got.x1_s
    delay = np.array([d for _, d in calls], dtype=float)[got.keep]
    ran, unpaid = ~np.isnan(x1), unpaid[got.keep]
    fill = np.where(ran, x1, fresh(len(x0)))  # a backup's draw, run or not
    drawn = np.where(ran, np.minimum(x0, delay + fill), x0)
    paid = np.where(unpaid, np.minimum(x0, delay + fill), drawn)
    paid_load = extra_load + float(unpaid.sum()) / len(calls)
    ideal_paid, _ = staggered(x0, fill, delay_for_load(x0, paid_load))
    return {
        "draws_over": p99(drawn) / p99(got.ideal_s),
        "draws_paid_over": p99(paid) / p99(ideal_paid),
        "paid_extra_load": paid_load,
    }


def p99(x: np.ndarray) -> float:
    return float(np.percentile(x, 99))


def _resamples(n: int, seed: int) -> np.ndarray:
    """BOOTSTRAP resamples (with replacement) of the indices of n calls."""
    return np.random.default_rng(seed).integers(0, n, (BOOTSTRAP, n))


def p99_interval(values_s: Sequence[float], seed: int = 0) -> list[float]:
    """The p99's 90% bootstrap interval, ms."""
    x = np.asarray(values_s, dtype=float)
    boots = np.percentile(x[_resamples(len(x), seed)], 99, axis=1)
    return [float(v) * 1e3 for v in np.percentile(boots, [5, 95])]


def ratio_interval(a: np.ndarray, b: np.ndarray, seed: int = 0) -> list[float]:
    """The 90% bootstrap interval of p99(a) / p99(b), the calls resampled as pairs."""
    idx = _resamples(len(a), seed)
    ratios = np.percentile(a[idx], 99, axis=1) / np.percentile(b[idx], 99, axis=1)
    return [float(v) for v in np.percentile(ratios, [5, 95])]
