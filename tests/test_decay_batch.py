"""The batch decay weights (coordinator.core.decay_batch.fold_weights) against folding:
an observation's weight at the end is the product of decay_weight over the later
observations of its partition."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core.decay_batch import carried_weight, fold_weights, forward_steps_s
from coordinator.core.params import DecayUnit, ProfileSettings
from coordinator.core.profiles import decay_weight
from coordinator.errors import InputError

CONFIGS = st.sampled_from([
    ProfileSettings(half_life=3.0, decay_unit=DecayUnit.OBSERVATIONS),
    ProfileSettings(half_life=0.5, decay_unit=DecayUnit.OBSERVATIONS),
    ProfileSettings(half_life=20.0, decay_unit=DecayUnit.SECONDS),
])  # fmt: skip


def folded(times: list[list[float]], cfg: ProfileSettings) -> list[float]:
    """Each observation's weight, by folding: every later one multiplies it by its
    decay_weight (from the observation before it)."""
    out = []
    for part in times:
        w = [1.0] * len(part)
        for j in range(1, len(part)):
            factor = decay_weight(cfg, part[j - 1], part[j])
            w[:j] = [x * factor for x in w[:j]]
        out += w
    return out


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(st.lists(st.floats(-50, 50), min_size=1, max_size=12), max_size=6),
    cfg=CONFIGS,
)
def test_the_weights_are_the_folds(parts: list[list[float]], cfg: ProfileSettings) -> None:
    # Times in any order: with decay by seconds a step back in time decays nothing.
    times = [list(np.cumsum(p)) for p in parts]
    sizes = [len(p) for p in parts]
    starts = np.cumsum([0, *sizes[:-1]]) if sizes else np.empty(0, np.int64)
    at = np.array([t for p in times for t in p], dtype=np.float64)
    got = fold_weights(starts, int(sum(sizes)), at, cfg)
    assert got is not None
    assert got == pytest.approx(folded(times, cfg), rel=1e-12, abs=1e-300)


def test_without_decay_there_are_no_weights() -> None:
    assert fold_weights(np.array([0, 2]), 5, None, ProfileSettings()) is None
    assert math.isinf(ProfileSettings().half_life)


def test_with_decay_by_observations_the_times_are_not_read() -> None:
    cfg = ProfileSettings(half_life=1.0, decay_unit=DecayUnit.OBSERVATIONS)
    got = fold_weights(np.array([0, 3]), 4, None, cfg)
    assert got is not None and got.tolist() == [0.25, 0.5, 1.0, 1.0]


@pytest.mark.parametrize(
    ("starts", "n", "match"),
    [([1], 3, r"starts \[1\]…; expected 0 first"), ([0, 2, 2], 4, r"\[0, 2, 2\]"),
     ([0, 5], 4, r"below the 4 rows"), ([], 2, r"starts \[\]")],
)  # fmt: skip
def test_partition_starts_out_of_order_are_refused(starts: list[int], n: int, match: str) -> None:
    cfg = ProfileSettings(half_life=2.0)
    with pytest.raises(InputError, match=match):
        fold_weights(np.array(starts, dtype=np.int64), n, None, cfg)


def test_decay_by_seconds_needs_a_time_per_row() -> None:
    cfg = ProfileSettings(half_life=2.0, decay_unit=DecayUnit.SECONDS)
    with pytest.raises(InputError, match=r"times of shape \(\); expected \(3,\)"):
        fold_weights(np.array([0]), 3, None, cfg)
    with pytest.raises(InputError, match=r"times of shape \(2,\); expected \(3,\)"):
        fold_weights(np.array([0]), 3, np.zeros(2), cfg)


@settings(max_examples=200, deadline=None)
@given(
    last=st.floats(-50, 50), later=st.lists(st.floats(-50, 50), min_size=1, max_size=10),
    cfg=CONFIGS,
)  # fmt: skip
def test_the_carried_weight_is_the_product_of_the_later_factors(
    last: float, later: list[float], cfg: ProfileSettings
) -> None:
    want, prev = 1.0, last
    for t in later:
        want *= decay_weight(cfg, prev, t)
        prev = t
    steps = forward_steps_s(np.array([0]), np.array([last, *later]))
    got = carried_weight(cfg, len(later), float(steps.sum()))
    assert got == pytest.approx(want, rel=1e-12, abs=1e-300)
    assert carried_weight(ProfileSettings(), len(later), float(steps.sum())) == 1.0


def test_forward_steps_start_each_partition_at_zero_and_never_go_back() -> None:
    steps = forward_steps_s(np.array([0, 3]), np.array([5.0, 7.0, 6.0, 1.0, 4.0]))
    assert steps.tolist() == [0.0, 2.0, 0.0, 0.0, 3.0]
