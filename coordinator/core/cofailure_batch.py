"""The co-failure fold (coordinator.core.cofailure.fold_groups) over many groups at once,
in arrays: what the profile recompute runs over a window of stored groups.

Reading 333k groups' arrays into Python objects and folding them one at a time made most
of the recompute's 3.5 s co-failure read over 1M member rows (bench/recompute.py); here
every step is a numpy pass over the packed members. The value is the fold's, from no
evidence, over the same groups in the same order:

- a candidate twice in one group (a retry) counts once, with its last score, as in the
  fold;
- a pair's sums are its per-group terms weighted by the decay its later groups apply.
  In the fold a group's term is multiplied by each later group's weight; here it is
  multiplied once by 0.5 to the power of the summed half-lives that elapse after it
  (observations, or seconds since the pair's previous group, as
  coordinator.core.profiles.decay_weight measures them:
  coordinator.core.decay_batch.fold_weights). Without decay every weight is
  exactly 1 and the sums are added in the fold's order, so the evidence is the fold's to
  the bit; with decay it differs by rounding (relative 1e-12 in the tests).

Pure: no I/O; validated once here (ids in order, scores in [0, 1], indices in range).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from coordinator.core.cofailure import CoFailure, PairStats
from coordinator.core.decay_batch import fold_weights
from coordinator.core.params import ProfileSettings
from coordinator.errors import InputError


def fold_batch(
    ids: Sequence[str],
    group: np.ndarray,
    cand: np.ndarray,
    phi: np.ndarray,
    at_s: np.ndarray,
    settings: ProfileSettings,
) -> CoFailure:
    """Fold groups ``0 … len(at_s) − 1`` in index order from no evidence: member ``k`` of
    group ``group[k]`` ran candidate ``ids[cand[k]]`` with failure score ``phi[k]``, and
    group ``g`` completed at ``at_s[g]``. ``ids`` in ascending order (a pair is kept
    under its ids in order, as :func:`coordinator.core.cofailure.pair_key` keeps it)."""
    group, cand, phi, at_s = _checked(ids, group, cand, phi, at_s)
    g, a, b, pa, pb = _pairs(*_last_per_candidate(group, cand, phi, len(ids)))
    if g.size == 0:
        return CoFailure()
    # Pair observations grouped by pair, each pair's in fold order.
    key = a * len(ids) + b
    order = _order(key, g, at_s.size)
    key, g, pa, pb = key[order], g[order], pa[order], pb[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    last = np.r_[starts[1:], key.size] - 1
    counts = last - starts + 1
    slot = np.repeat(np.arange(starts.size), counts)
    w = fold_weights(starts, key.size, at_s[g], settings)
    n_pairs = starts.size

    def total(x: np.ndarray) -> np.ndarray:
        # bincount adds each slot's terms one by one in input order: the fold's order.
        return np.bincount(slot, weights=x if w is None else x * w, minlength=n_pairs)

    ones = np.ones(key.size)
    sums = (total(ones), total(pa), total(pb), total(pa * pb))
    pairs = {}
    for i, s in enumerate(starts):
        k = int(key[s])
        pairs[(ids[k // len(ids)], ids[k % len(ids)])] = PairStats(
            float(sums[0][i]), float(sums[1][i]), float(sums[2][i]), float(sums[3][i]),
            int(counts[i]), float(at_s[g[last[i]]]),
        )  # fmt: skip
    return CoFailure(pairs)


def _checked(
    ids: Sequence[str], group: np.ndarray, cand: np.ndarray, phi: np.ndarray, at_s: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    bad = next((i for i in range(1, len(ids)) if not ids[i - 1] < ids[i]), None)
    if bad is not None:
        raise InputError(
            f"candidate ids {ids[bad - 1]!r}, {ids[bad]!r}; expected distinct ids in order"
        )
    group, cand = np.asarray(group, dtype=np.int64), np.asarray(cand, dtype=np.int64)
    phi, at_s = np.asarray(phi, dtype=np.float64), np.asarray(at_s, dtype=np.float64)
    if not group.shape == cand.shape == phi.shape or group.ndim != 1 or at_s.ndim != 1:
        raise InputError(
            f"member arrays of shapes {group.shape}, {cand.shape}, {phi.shape} and group "
            f"times of shape {at_s.shape}; expected three equal 1-d shapes and a 1-d one"
        )
    for name, x, top in (("group", group, at_s.size), ("candidate", cand, len(ids))):
        out = (x < 0) | (x >= top)
        if out.any():
            raise InputError(f"{name} index {int(x[out][0])}; expected 0 ≤ index < {top}")
    out = ~((phi >= 0.0) & (phi <= 1.0))
    if out.any():
        raise InputError(f"failure score {float(phi[out][0])!r}; expected a number in [0, 1]")
    if not np.isfinite(at_s).all():
        raise InputError(f"group time {float(at_s[~np.isfinite(at_s)][0])!r}; expected finite")
    return group, cand, phi, at_s


def _order(major: np.ndarray, minor: np.ndarray, minor_size: int) -> np.ndarray:
    """The stable order by (major, minor), minor in ``[0, minor_size)``: one sort of a
    combined key, three times faster than numpy's lexsort (the pair of keys is the
    fallback where the combined key could overflow)."""
    if major.size == 0 or int(major.max()) < (2**62) // max(1, minor_size):
        return np.argsort(major * minor_size + minor, kind="stable")
    return np.lexsort((minor, major))


def _last_per_candidate(
    group: np.ndarray, cand: np.ndarray, phi: np.ndarray, n_ids: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Members sorted by (group, candidate), one per candidate and group: its last score."""
    order = _order(group, cand, n_ids)
    group, cand, phi = group[order], cand[order], phi[order]
    keep = np.r_[(group[1:] != group[:-1]) | (cand[1:] != cand[:-1]), True][: group.size]
    return group[keep], cand[keep], phi[keep]


def _pairs(
    group: np.ndarray, cand: np.ndarray, phi: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every pair of members of one group (candidates in order, as the sort left them):
    members ``d`` apart in the sorted arrays, for every ``d`` a group is long enough for."""
    parts: list[tuple[np.ndarray, ...]] = []
    if group.size:
        size = np.bincount(group).max()
        for d in range(1, int(size)):
            same = np.flatnonzero(group[d:] == group[:-d])
            parts.append((group[same], cand[same], cand[same + d], phi[same], phi[same + d]))
    if not parts:
        empty_i, empty_f = np.empty(0, np.int64), np.empty(0, np.float64)
        return empty_i, empty_i, empty_i, empty_f, empty_f
    g, a, b, pa, pb = (np.concatenate(x) for x in zip(*parts, strict=True))
    return g, a, b, pa, pb
