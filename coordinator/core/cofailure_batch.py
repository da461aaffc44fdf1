"""The co-failure fold (coordinator.core.cofailure.fold_groups) over many groups at once,
in arrays: what the profile recompute runs over a window of stored groups.

Reading 333k groups' arrays into Python objects and folding them one at a time made most
of the recompute's 3.5 s co-failure read over 1M member rows (bench/recompute.py); here
every step is a numpy pass over the packed members. The value is the fold's over the
same groups in the same order, from the same evidence:

- a candidate twice in one group (a retry) counts once, with its last score, as in the
  fold;
- a pair's sums are its per-group terms weighted by the decay its later groups apply.
  In the fold a group's term is multiplied by each later group's weight; here it is
  multiplied once by 0.5 to the power of the summed half-lives that elapse after it
  (observations, or seconds since the pair's previous group, as
  coordinator.core.profiles.decay_weight measures them:
  coordinator.core.decay_batch.fold_weights). Without decay every weight is
  exactly 1 and the sums are added in the fold's order, so the evidence is the fold's to
  the bit; with decay it differs by rounding (relative 1e-12 in the tests);
- the sums of the batches before (:class:`PairSums`) enter each pair's as one more term
  ahead of the pair's first, at its last time, with its sums for values: they decay as
  the fold decays them (by the batch's later observations, or by the seconds from that
  last time on), and without decay they are added first, as the fold adds to them. So
  folding groups batch by batch, each batch into the sums of the ones before, gives the
  value of one fold over them all, and a window's groups need not all be held at once.

Pure: no I/O; validated once here (ids in order, scores in [0, 1], indices in range).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from coordinator.core.cofailure import PairKey, PairStats
from coordinator.core.decay_batch import fold_weights
from coordinator.core.params import ProfileSettings
from coordinator.errors import InputError


@dataclass(frozen=True, slots=True)
class PairSums:
    """Pairs' sums in arrays, one entry per pair, ascending by key ``a·len(ids) + b``
    (``a``, ``b`` the candidates' indices in ``ids``, a < b): what a fold batch by batch
    carries from one batch to the next, turned into PairStats once at the end
    (:meth:`pairs`), since building every pair's PairStats per batch cost 60 ms a batch
    with 200 candidates' 19 900 pairs."""

    key: np.ndarray
    at_s: np.ndarray  # the pair's last time
    observations: np.ndarray  # float64: exact below 2⁵³
    n: np.ndarray
    s_a: np.ndarray
    s_b: np.ndarray
    s_ab: np.ndarray

    @staticmethod
    def empty() -> PairSums:
        f = np.empty(0, np.float64)
        return PairSums(np.empty(0, np.int64), f, f, f, f, f, f)

    def pairs(self, ids: Sequence[str]) -> dict[PairKey, PairStats]:
        out = {}
        for i, k in enumerate(self.key.tolist()):
            out[(ids[k // len(ids)], ids[k % len(ids)])] = PairStats(
                float(self.n[i]), float(self.s_a[i]), float(self.s_b[i]), float(self.s_ab[i]),
                int(self.observations[i]), float(self.at_s[i]),
            )  # fmt: skip
        return out


def fold_sums(
    ids: Sequence[str],
    group: np.ndarray,
    cand: np.ndarray,
    phi: np.ndarray,
    at_s: np.ndarray,
    settings: ProfileSettings,
    before: PairSums,
) -> PairSums:
    """Fold groups ``0 … len(at_s) − 1`` in index order into the sums ``before`` (of the
    same ``ids``; :meth:`PairSums.empty` for no evidence): member ``k`` of group
    ``group[k]`` ran candidate ``ids[cand[k]]`` with failure score ``phi[k]``, and group
    ``g`` completed at ``at_s[g]``. ``ids`` in ascending order (a pair is kept under its
    ids in order, as :func:`coordinator.core.cofailure.pair_key` keeps it). The pairs of
    ``before`` that the groups do not hold come out as they were."""
    group, cand, phi, at_s = _checked(ids, group, cand, phi, at_s)
    g, a, b, pa, pb = _pairs(*_last_per_candidate(group, cand, phi, len(ids)))
    if g.size == 0:
        return before
    # A row per pair observation (values: 1, φa, φb, φaφb) and, ahead of a pair's first,
    # one per carried pair (values: its sums); ranked by group index + 1, carried at 0.
    key = np.r_[before.key, a * len(ids) + b]
    rank = np.r_[np.zeros(before.key.size, np.int64), g + 1]
    order = _order(key, rank, at_s.size + 1)  # by pair, each pair's in fold order
    key = key[order]
    t = np.r_[before.at_s, at_s[g]][order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    last = np.r_[starts[1:], key.size] - 1
    slot = np.repeat(np.arange(starts.size), last - starts + 1)
    w = fold_weights(starts, key.size, t, settings)

    def total(carried: np.ndarray, x: np.ndarray, weighted: bool = True) -> np.ndarray:
        # bincount adds each slot's terms one by one in input order: the fold's order. A
        # pair with no new term keeps its sums exactly (a weight of 1, added to nothing).
        x = np.r_[carried, x][order]
        return np.bincount(slot, x if w is None or not weighted else x * w, starts.size)

    return PairSums(
        key[starts], t[last], total(before.observations, np.ones(g.size), weighted=False),
        total(before.n, np.ones(g.size)), total(before.s_a, pa), total(before.s_b, pb),
        total(before.s_ab, pa * pb),
    )  # fmt: skip


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
