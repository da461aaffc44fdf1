"""The array fold (coordinator.core.cofailure_batch) is the sequential fold
(coordinator.core.cofailure.fold_groups) over the same groups: to the bit without decay,
to rounding with decay by observations or by seconds."""

from __future__ import annotations

import random

import numpy as np
import pytest

from coordinator.core.cofailure import CoFailure, fold_groups
from coordinator.core.cofailure_batch import PairSums, _order, fold_sums
from coordinator.core.params import DecayUnit, ProfileSettings
from coordinator.errors import InputError

Groups = list[tuple[list[tuple[str, float]], float]]
IDS = sorted(["a", "b", "c", "d", "e", "B", "é", "a1"])  # code-point order, like str


def random_groups(seed: int, n: int, shuffled_times: bool = False) -> Groups:
    rng = random.Random(seed)
    groups: Groups = []
    t = 1000.0
    for _ in range(n):
        t += rng.choice([0.0, 0.5, 3.0, 40.0])  # ties too
        size = rng.choice([1, 2, 2, 3, 4, 6])
        members = [(rng.choice(IDS), rng.choice([0.0, 1.0, rng.random()])) for _ in range(size)]
        at = t - rng.uniform(0, 100) if shuffled_times else t
        groups.append((members, at))
    return groups


def as_arrays(groups: Groups) -> tuple[np.ndarray, ...]:
    index = {c: i for i, c in enumerate(IDS)}
    g = [k for k, (members, _) in enumerate(groups) for _ in members]
    cand = [index[c] for members, _ in groups for c, _ in members]
    phi = [p for members, _ in groups for _, p in members]
    return np.array(g), np.array(cand), np.array(phi), np.array([at for _, at in groups])


def fold_batch(
    ids: list[str], group: np.ndarray, cand: np.ndarray, phi: np.ndarray, at_s: np.ndarray,
    cfg: ProfileSettings,
) -> CoFailure:  # fmt: skip
    """The array fold from no evidence, as the sequential fold hands it out."""
    return CoFailure(fold_sums(ids, group, cand, phi, at_s, cfg, PairSums.empty()).pairs(ids))


SETTINGS = {
    "none": ProfileSettings(),
    "observations": ProfileSettings(half_life=7.0, decay_unit=DecayUnit.OBSERVATIONS),
    "seconds": ProfileSettings(half_life=90.0, decay_unit=DecayUnit.SECONDS),
}


@pytest.mark.parametrize("decay", sorted(SETTINGS))
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("shuffled", [False, True])
def test_the_array_fold_is_the_sequential_fold(decay: str, seed: int, shuffled: bool) -> None:
    cfg = SETTINGS[decay]
    groups = random_groups(seed, 400, shuffled_times=shuffled)
    want = fold_groups(CoFailure(), groups, cfg)
    got = fold_batch(IDS, *as_arrays(groups), cfg)
    assert_same(got, want, decay)


def assert_same(got: CoFailure, want: CoFailure, decay: str) -> None:
    assert sorted(got.pairs) == sorted(want.pairs) and len(want.pairs) > 10
    for key, p in want.pairs.items():
        q = got.pairs[key]
        assert (q.observations, q.last_seen_s) == (p.observations, p.last_seen_s)
        if decay == "none":
            assert (q.n, q.s_a, q.s_b, q.s_ab) == (p.n, p.s_a, p.s_b, p.s_ab)  # to the bit
        else:
            assert (q.n, q.s_a, q.s_b, q.s_ab) == pytest.approx(
                (p.n, p.s_a, p.s_b, p.s_ab), rel=1e-12, abs=1e-300
            )


@pytest.mark.parametrize("decay", sorted(SETTINGS))
@pytest.mark.parametrize("cuts", [[1], [200], [37, 38, 250, 399], list(range(0, 400, 25))])
@pytest.mark.parametrize("shuffled", [False, True])
def test_batch_by_batch_from_the_evidence_before_is_one_fold(
    decay: str, cuts: list[int], shuffled: bool
) -> None:
    cfg = SETTINGS[decay]
    groups = random_groups(5, 400, shuffled_times=shuffled)
    sums = PairSums.empty()
    for lo, hi in zip([0, *cuts], [*cuts, len(groups)], strict=True):
        sums = fold_sums(IDS, *as_arrays(groups[lo:hi]), cfg, sums)
    assert sums.key.tolist() == sorted(sums.key.tolist())
    assert_same(CoFailure(sums.pairs(IDS)), fold_groups(CoFailure(), groups, cfg), decay)


def test_a_retried_candidate_counts_once_with_its_last_score() -> None:
    groups: Groups = [([("a", 1.0), ("b", 0.25), ("a", 0.0)], 5.0)]
    got = fold_batch(IDS, *as_arrays(groups), ProfileSettings())
    p = got.pairs[("a", "b")]
    assert (p.n, p.s_a, p.s_b, p.s_ab, p.observations, p.last_seen_s) == (
        1.0, 0.0, 0.25, 0.0, 1, 5.0,
    )  # fmt: skip
    assert got.pairs == fold_groups(CoFailure(), groups, ProfileSettings()).pairs


def test_groups_of_one_candidate_and_no_groups_give_no_evidence() -> None:
    groups: Groups = [([("a", 1.0)], 1.0), ([("b", 0.0), ("b", 1.0)], 2.0)]
    assert fold_batch(IDS, *as_arrays(groups), ProfileSettings()).pairs == {}
    empty = np.array([], dtype=np.int64)
    assert fold_batch(IDS, empty, empty, empty.astype(float), empty.astype(float),
                      ProfileSettings()).pairs == {}  # fmt: skip


@pytest.mark.parametrize(
    ("ids", "arrays", "message"),
    [
        (["b", "a"], ([0], [0], [0.5], [1.0]), "'b', 'a'; expected distinct ids in order"),
        (["a", "a"], ([0], [0], [0.5], [1.0]), "'a', 'a'"),
        (["a"], ([0], [0], [1.5], [1.0]), "failure score 1.5"),
        (["a"], ([0], [0], [float("nan")], [1.0]), "failure score nan"),
        (["a"], ([1], [0], [0.5], [1.0]), "group index 1; expected 0 ≤ index < 1"),
        (["a"], ([0], [-1], [0.5], [1.0]), "candidate index -1"),
        (["a"], ([0], [0, 0], [0.5], [1.0]), "shapes"),
        (["a"], ([0], [0], [0.5], [float("inf")]), "group time inf"),
    ],
)
def test_bad_input_is_named(ids: list[str], arrays: tuple[list[float], ...], message: str) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        fold_batch(ids, *(np.array(a) for a in arrays), ProfileSettings())


@pytest.mark.parametrize("major_top", [50, 2**61])  # the combined key, then the fallback
def test_the_order_is_by_major_then_minor_and_stable(major_top: int) -> None:
    rng = np.random.default_rng(4)
    major = rng.integers(0, 6, 500) * (major_top // 5)
    minor = rng.integers(0, 7, 500)
    got = _order(major, minor, 7)
    want = sorted(range(500), key=lambda i: (major[i], minor[i], i))
    assert got.tolist() == want
