"""One definition of each percentile (coordinator.core.percentiles): nearest rank as the
method defines it, the median, and the benchmarks' numpy methods."""

from __future__ import annotations

import math
import statistics
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.core.percentiles import RankedWindow, interpolated, lower, median, nearest_rank
from coordinator.errors import InputError

floats = st.floats(-1e6, 1e6, allow_nan=False)


def exact_rank(n: int, percentile: Fraction) -> int:
    """The nearest rank in exact arithmetic: ⌈p/100 · n⌉, at least 1."""
    return max(1, math.ceil(percentile / 100 * n))


def test_p95_of_twenty_values_is_the_nineteenth() -> None:
    values = [float(v) for v in range(20, 0, -1)]
    assert nearest_rank(values, 95.0) == 19.0
    assert nearest_rank(values, 50.0) == 10.0
    assert nearest_rank(values, 100.0) == 20.0
    assert nearest_rank(values, 0.0) == 1.0  # the smallest value


def test_nearest_rank_has_no_float_noise_where_numpy_has() -> None:
    # 28 % of 25 values is rank 7 exactly; 0.28 · 25 is 7.000000000000001 in floats, and
    # numpy's inverted_cdf steps to rank 8 there. The rank here is the exact one.
    values = [float(v) for v in range(1, 26)]
    assert nearest_rank(values, 28.0) == 7.0
    assert float(np.percentile(values, 28.0, method="inverted_cdf")) == 8.0


def test_nearest_rank_is_exact_over_a_grid_of_sizes_and_percentiles() -> None:
    for n in range(1, 121):
        values = [float(v) for v in range(n)]
        for tenths in range(0, 1001, 7):
            want = values[exact_rank(n, Fraction(tenths, 10)) - 1]
            assert nearest_rank(values, tenths / 10) == want, (n, tenths)


@given(st.lists(floats, min_size=1, max_size=60), st.integers(1, 100))
def test_nearest_rank_is_an_observed_value_with_p_percent_at_or_below(
    values: list[float], percentile: int
) -> None:
    got = nearest_rank(values, percentile)
    assert got in values
    assert sum(v <= got for v in values) * 100 >= percentile * len(values)
    assert sum(v < got for v in values) * 100 < percentile * len(values)


@pytest.mark.parametrize(("values", "percentile"), [([], 50.0), ([1.0], -1.0), ([1.0], 100.5)])
def test_nearest_rank_refuses_what_it_cannot_answer(values: list[float], percentile: float) -> None:
    with pytest.raises(InputError, match="expected"):
        nearest_rank(values, percentile)


@given(st.lists(floats, min_size=1, max_size=40))
def test_median_is_numpys_and_the_standard_librarys(values: list[float]) -> None:
    got = median(values)
    assert got == float(np.median(values)) == statistics.median(values)
    assert median(np.asarray(values)) == got


def test_median_of_nothing_is_the_default_or_an_error() -> None:
    assert median([], default=2.5) == 2.5
    assert median([], default=math.inf) == math.inf
    with pytest.raises(InputError, match="no values"):
        median([])


@given(st.lists(floats, min_size=1, max_size=60), st.sampled_from([50, 90, 95, 99]))
def test_lower_is_the_floor_index_of_the_sorted_values(values: list[float], q: int) -> None:
    ordered = sorted(values)
    assert lower(values, q) == ordered[int(q / 100 * (len(ordered) - 1))]


def test_interpolated_is_numpys_linear_and_nan_when_empty() -> None:
    assert interpolated([1.0, 2.0, 3.0, 4.0], 50, 100) == [2.5, 4.0]
    assert all(math.isnan(v) for v in interpolated([], 50, 99))


@given(
    st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=1, max_size=60),
    st.integers(1, 25),
    st.floats(0.0, 100.0),
)
def test_a_ranked_window_ranks_its_last_values(values: list[float], size: int, p: float) -> None:
    window = RankedWindow(size)
    for i, v in enumerate(values):
        window.add(v)
        kept = values[max(0, i + 1 - size) : i + 1]
        assert len(window) == len(kept)
        assert nearest_rank(window, p) == nearest_rank(kept, p)


def test_a_ranked_window_refuses_what_has_no_rank() -> None:
    with pytest.raises(InputError, match="size=0"):
        RankedWindow(0)
    window = RankedWindow(3)
    with pytest.raises(InputError, match="value=nan"):
        window.add(math.nan)
    with pytest.raises(InputError, match="no values"):
        nearest_rank(window, 50.0)
