"""The dual-bound allocation rule (spec §2-§3) and its ablations (spec §7)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from coordinator.core.methods import PoolView, haco_variant
from coordinator.core.params import PolicyParams
from coordinator.core.policy import Allocation, CandidateArrays, FixedMemo, allocate, validate
from coordinator.errors import InputError, PolicyError
from schemas.enums import StopReason

FIELDS = ("alpha", "beta", "f_int", "loss", "t_proc_s", "bytes", "bandwidth_Bps", "jitter_Bps")
TOL = 1e-12
# The per-candidate arrays of an Allocation (r_minus checked beside them).
ALLOCATION_ARRAYS = ("order", "p_success_cum", "mu", "sigma", "rho", "T_s", "C", "D", "u_plus")

Row = tuple[float, float, float, float, float, float, float, float]


def make_stats(rows: list[Row]) -> CandidateArrays:
    return CandidateArrays.from_columns(
        **{name: [row[i] for row in rows] for i, name in enumerate(FIELDS)}
    )


def cold_row(f_int: float = 0.0, loss: float = 0.0, t_proc: float = 1.0) -> Row:
    return (1.0, 1.0, f_int, loss, t_proc, 0.0, math.inf, 0.0)


rows_st = st.tuples(
    st.floats(0.05, 200.0),  # alpha
    st.floats(0.05, 200.0),  # beta
    st.floats(0.0, 1.0),  # f_int
    st.floats(0.0, 1.0),  # loss
    st.floats(1e-3, 30.0),  # t_proc_s
    st.floats(0.0, 1e6),  # bytes
    st.one_of(st.just(math.inf), st.floats(0.0, 1e8)),  # bandwidth_Bps
    st.floats(0.0, 1e7),  # jitter_Bps
)
# Pools drawn from a few templates so that exact U⁺ ties (duplicates) are common.
pools_st = st.lists(rows_st, min_size=1, max_size=4).flatmap(
    lambda templates: st.lists(st.sampled_from(templates), min_size=1, max_size=10)
)
params_st = st.builds(
    PolicyParams,
    tau=st.floats(0.05, 0.99),
    lam=st.floats(0.0, 3.0),
    gamma=st.floats(0.0, 3.0),
    kappa=st.floats(0.0, 5.0),
    eta=st.floats(0.0, 2.0),
)
full_params_st = st.builds(
    PolicyParams,
    tau=st.floats(0.05, 0.99),
    lam=st.floats(0.0, 3.0),
    gamma=st.floats(0.0, 3.0),
    kappa=st.floats(0.0, 5.0),
    eta=st.floats(0.0, 2.0),
    eps_b=st.floats(1e-9, 10.0),
    eps_r=st.floats(0.0, 1.0),
    r_cap=st.floats(0.05, 0.999),
)


def conservative(r_minus: list[float]) -> float:
    p_fail = 1.0
    for r in r_minus:
        p_fail *= 1.0 - r
    return 1.0 - p_fail


# ---------------------------------------------------------------- (a)-(d) properties


@settings(max_examples=200, deadline=None, database=None)
@given(pools_st, params_st)
def test_chosen_set_is_shortest_prefix_of_stable_u_plus_order(
    rows: list[Row], params: PolicyParams
) -> None:
    alloc = allocate(make_stats(rows), params)
    u = [float(x) for x in alloc.u_plus]
    expected_order = sorted(range(len(rows)), key=lambda i: -u[i])  # stable: pool order
    assert alloc.order.tolist() == expected_order
    ranked_r = [float(alloc.r_minus[i]) for i in expected_order]
    for k in range(1, alloc.size):
        assert conservative(ranked_r[:k]) < params.tau + TOL
    if alloc.stop is StopReason.TARGET_REACHED:
        assert conservative(ranked_r[: alloc.size]) >= params.tau - TOL
    else:
        assert alloc.size == len(rows)
        assert conservative(ranked_r) < params.tau + TOL
    assert alloc.members.tolist() == expected_order[: alloc.size]
    assert alloc.p_success == pytest.approx(conservative(ranked_r[: alloc.size]), abs=TOL)


@settings(max_examples=200, deadline=None, database=None)
@given(pools_st, params_st)
def test_p_success_is_non_decreasing_in_prefix_length(
    rows: list[Row], params: PolicyParams
) -> None:
    alloc = allocate(make_stats(rows), params)
    p = alloc.p_success_cum.tolist()
    assert len(p) == len(rows)
    assert all(later >= earlier for earlier, later in itertools.pairwise(p))
    assert all(0.0 <= x <= 1.0 for x in p)
    assert alloc.p_success == p[alloc.size - 1]


@settings(max_examples=200, deadline=None, database=None)
@given(pools_st, params_st)
def test_r_minus_stays_between_floor_and_cap(rows: list[Row], params: PolicyParams) -> None:
    alloc = allocate(make_stats(rows), params)
    for r, rho in zip(alloc.r_minus.tolist(), alloc.rho.tolist(), strict=True):
        assert r <= 0.98 + TOL
        assert r >= params.eps_r * rho - TOL


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=8), st.floats(0.05, 0.99))
def test_pool_that_cannot_reach_tau_is_taken_whole(f_ints: list[float], tau: float) -> None:
    rows = [cold_row(f_int=f) for f in f_ints]
    params = PolicyParams(tau=tau)
    alloc = allocate(make_stats(rows), params)
    p_all = conservative([float(alloc.r_minus[i]) for i in alloc.order])
    assume(abs(p_all - tau) > TOL)
    reachable = p_all >= tau
    if not reachable:
        assert alloc.stop is StopReason.POOL_EXHAUSTED
        assert alloc.size == len(rows)
        assert sorted(alloc.members.tolist()) == list(range(len(rows)))
    else:
        assert alloc.stop is StopReason.TARGET_REACHED


@pytest.mark.parametrize(
    ("tau", "size"), [(0.5, 1), (0.75, 2), (0.875, 3), (0.876, 4), (0.9375, 4)]
)
def test_p_success_equal_to_tau_reaches_it(tau: float, size: int) -> None:
    # r_cap = 0.5 makes every R⁻ exactly 0.5, so P_succ = 1 - 2^-k is exact in binary.
    rows = [(50.0, 1.0, 0.0, 0.0, 1.0, 0.0, math.inf, 0.0)] * 4
    alloc = allocate(make_stats(rows), PolicyParams(tau=tau, r_cap=0.5))
    assert alloc.r_minus.tolist() == [0.5] * 4
    assert alloc.size == size
    assert alloc.p_success >= tau
    assert alloc.stop is StopReason.TARGET_REACHED


def test_unreachable_target_exhausts_pool_example() -> None:
    rows = [cold_row(f_int=0.5), cold_row(loss=0.9), cold_row()]
    alloc = allocate(make_stats(rows), PolicyParams(tau=0.95))
    assert alloc.stop is StopReason.POOL_EXHAUSTED
    assert alloc.size == 3
    assert alloc.p_success < 0.95


# ---------------------------------------------------------------- (e) recomputation


def reference(rows: list[Row], p: PolicyParams) -> dict[str, list[float]]:
    """The spec's formulas, written out again with plain floats."""
    out: dict[str, list[float]] = {k: [] for k in ("mu", "sigma", "rho", "T", "C", "D", "U", "R")}
    for alpha, beta, f_int, loss, t_proc, k, bw, jit in rows:
        s = alpha + beta
        out["mu"].append(alpha / s)
        out["sigma"].append(math.sqrt(alpha * beta / (s**2 * (s + 1.0))))
        out["rho"].append((1.0 - f_int) * (1.0 - loss))
        out["T"].append(t_proc + k / max(p.eps_b, bw - p.kappa * jit))
    t0 = statistics.median(out["T"])
    for i in range(len(rows)):
        mu, sigma, rho = out["mu"][i], out["sigma"][i], out["rho"][i]
        c = math.log1p(out["T"][i] / t0)
        d = 1.0 + p.eta * c
        out["C"].append(c)
        out["D"].append(d)
        out["U"].append(min(1.0, mu + p.lam * sigma) * rho / d)
        out["R"].append(min(p.r_cap, max(p.eps_r, mu - p.gamma * sigma) * rho))
    return out


@settings(max_examples=200, deadline=None, database=None)
@given(pools_st, full_params_st)
def test_quantities_match_independent_recomputation(rows: list[Row], params: PolicyParams) -> None:
    alloc = allocate(make_stats(rows), params)
    ref = reference(rows, params)
    got = {
        "mu": alloc.mu,
        "sigma": alloc.sigma,
        "rho": alloc.rho,
        "T": alloc.T_s,
        "C": alloc.C,
        "D": alloc.D,
        "U": alloc.u_plus,
        "R": alloc.r_minus,
    }
    for key, values in got.items():
        for mine, theirs in zip(ref[key], values.tolist(), strict=True):
            assert math.isclose(mine, theirs, rel_tol=1e-9, abs_tol=1e-9), key


# ---------------------------------------------------------------- (f) worked example


def test_worked_example_of_spec_section_3() -> None:
    params = PolicyParams(tau=0.90)
    alpha, beta = 9.0, 1.0
    s = alpha + beta
    mu = alpha / s
    sigma = math.sqrt(alpha * beta / (s**2 * (s + 1.0)))
    lower = mu - params.gamma * sigma
    # Link loss chosen so that R⁻ = lower · (1 − loss) hits 0.68 and 0.70 exactly.
    loss_regional = 1.0 - 0.68 / lower
    loss_global = 1.0 - 0.70 / lower
    rows: list[Row] = [
        (alpha, beta, 0.0, loss_global, 3.0, 0.0, math.inf, 0.0),  # Global: slow
        (1.0, 1.0, 0.5, 0.0, 2.0, 0.0, math.inf, 0.0),  # Local: weak and flaky
        (alpha, beta, 0.0, loss_regional, 1.0, 0.0, math.inf, 0.0),  # Regional: fast
    ]
    # T0 = median(3, 2, 1) = 2, so the latency discount ranks Regional above Global.
    d_regional = 1.0 + params.eta * math.log1p(1.0 / 2.0)
    d_global = 1.0 + params.eta * math.log1p(3.0 / 2.0)
    u_top = min(1.0, mu + params.lam * sigma)
    assert u_top * (1 - loss_regional) / d_regional > u_top * (1 - loss_global) / d_global

    alloc = allocate(make_stats(rows), params)
    assert alloc.order.tolist() == [2, 0, 1]
    assert alloc.r_minus[2] == pytest.approx(0.68, abs=1e-12)
    assert alloc.r_minus[0] == pytest.approx(0.70, abs=1e-12)
    assert alloc.p_success_cum[0] == pytest.approx(0.68, abs=1e-12)
    assert alloc.members.tolist() == [2, 0]
    assert alloc.size == 2
    assert alloc.stop is StopReason.TARGET_REACHED
    assert alloc.p_success == pytest.approx(1.0 - 0.32 * 0.30, abs=1e-12)
    assert alloc.p_success == pytest.approx(0.904, abs=1e-12)


# ---------------------------------------------------------------- (g) cold start


def test_cold_start_values() -> None:
    alloc = allocate(make_stats([cold_row(f_int=0.2), cold_row()]), PolicyParams())
    assert alloc.mu.tolist() == [0.5, 0.5]
    assert alloc.sigma[0] == pytest.approx(math.sqrt(1.0 / 12.0), abs=1e-12)
    assert alloc.sigma[0] == pytest.approx(0.2887, abs=1e-4)
    assert alloc.r_minus[1] == pytest.approx(0.298, abs=1e-3)
    assert alloc.r_minus[0] / alloc.rho[0] == pytest.approx(alloc.r_minus[1], abs=1e-12)
    assert alloc.rho[0] == pytest.approx(0.8)


def test_fresh_pool_of_six_is_hedged_in_full_and_seven_reach_tau() -> None:
    six = allocate(make_stats([cold_row() for _ in range(6)]), PolicyParams(tau=0.9))
    assert six.size == 6
    assert six.stop is StopReason.POOL_EXHAUSTED
    assert six.p_success < 0.9
    seven = allocate(make_stats([cold_row() for _ in range(7)]), PolicyParams(tau=0.9))
    assert seven.size == 7
    assert seven.stop is StopReason.TARGET_REACHED
    assert seven.order.tolist() == list(range(7))  # all tied: pool order


# ---------------------------------------------------------------- (h) validation


def columns(rows: list[Row]) -> dict[str, list[float]]:
    return {name: [row[i] for row in rows] for i, name in enumerate(FIELDS)}


def test_empty_pool_is_rejected() -> None:
    with pytest.raises(PolicyError, match="empty"):
        CandidateArrays.from_columns(**{name: [] for name in FIELDS})
    empty = CandidateArrays(*(np.zeros(0) for _ in FIELDS))
    with pytest.raises(PolicyError, match="empty"):
        validate(empty)


@pytest.mark.parametrize(
    ("field", "value", "pattern"),
    [
        ("alpha", math.nan, r"alpha\[1\]"),
        ("beta", -1.0, r"beta\[1\]"),
        ("loss", math.nan, r"loss\[1\]"),
        ("t_proc_s", -0.5, r"t_proc_s\[1\]"),
        ("bytes", math.nan, r"bytes\[1\]"),
        ("jitter_Bps", -3.0, r"jitter_Bps\[1\]"),
        ("f_int", 1.5, r"f_int\[1\]"),
        ("loss", 1.01, r"loss\[1\]"),
        ("alpha", 0.0, r"alpha\[1\]"),
        ("beta", math.inf, r"beta\[1\]"),
    ],
)
def test_bad_statistic_is_rejected_naming_the_field(field: str, value: float, pattern: str) -> None:
    cols = columns([cold_row(), cold_row()])
    cols[field][1] = value
    with pytest.raises(PolicyError, match=pattern):
        CandidateArrays.from_columns(**cols)
    raw = CandidateArrays(**{k: np.asarray(v, dtype=np.float64) for k, v in cols.items()})
    with pytest.raises(PolicyError, match=pattern):
        validate(raw)


def test_missing_or_ragged_columns_are_rejected() -> None:
    cols = columns([cold_row(), cold_row()])
    del cols["loss"]
    with pytest.raises(PolicyError, match="loss"):
        CandidateArrays.from_columns(**cols)
    cols = columns([cold_row(), cold_row()])
    cols["bytes"] = [0.0]
    with pytest.raises(PolicyError, match="bytes"):
        CandidateArrays.from_columns(**cols)


@pytest.mark.parametrize("tau", [0.0, 1.0, 1.5, -0.1])
def test_tau_outside_open_unit_interval_is_rejected(tau: float) -> None:
    with pytest.raises(ValidationError):
        PolicyParams(tau=tau)


# ---------------------------------------------------------------- (i) ablations


def view_of(rows: list[Row]) -> PoolView:
    n = len(rows)
    return PoolView(
        ids=[f"c{i}" for i in range(n)],
        zones=["z"] * n,
        stats=make_stats(rows),
        calls=np.zeros(n),
        success_rate=np.zeros(n),
        mean_quality=np.zeros(n),
    )


def decide(variant: str, rows: list[Row], params: PolicyParams | None = None) -> Allocation:
    method = haco_variant(params or PolicyParams(), variant)
    decision = method.decide(view_of(rows), np.random.default_rng(0))
    assert decision.allocation is not None
    assert decision.members == tuple(decision.allocation.members.tolist())
    return decision.allocation


@settings(max_examples=200, deadline=None, database=None)
@given(pools_st)
def test_wo_env_ignores_environment(rows: list[Row]) -> None:
    alloc = decide("wo_env", rows)
    assert alloc.rho.tolist() == [1.0] * len(rows)
    assert alloc.D.tolist() == [1.0] * len(rows)
    ref = reference(
        [(a, b, 0.0, 0.0, 1.0, 0.0, math.inf, 0.0) for a, b, *_ in rows], PolicyParams(eta=0.0)
    )
    for mine, theirs in zip(ref["U"], alloc.u_plus.tolist(), strict=True):
        assert math.isclose(mine, theirs, rel_tol=1e-9, abs_tol=1e-12)


@settings(max_examples=200, deadline=None, database=None)
@given(pools_st)
def test_wo_ucb_ranks_by_neutral_score(rows: list[Row]) -> None:
    alloc = decide("wo_ucb", rows, PolicyParams(lam=2.5))
    neutral = alloc.mu * alloc.rho / alloc.D
    np.testing.assert_allclose(alloc.u_plus, neutral, rtol=1e-12, atol=1e-15)
    expected = sorted(range(len(rows)), key=lambda i: -float(alloc.u_plus[i]))
    assert alloc.order.tolist() == expected


@settings(max_examples=200, deadline=None, database=None)
@given(pools_st)
def test_wo_lcb_uses_neutral_reliability(rows: list[Row]) -> None:
    alloc = decide("wo_lcb", rows)
    for i, (a, b, f, loss, *_) in enumerate(rows):
        mu = a / (a + b)
        expected = min(0.98, max(0.1, mu) * (1.0 - f) * (1.0 - loss))
        assert math.isclose(float(alloc.r_minus[i]), expected, rel_tol=1e-9, abs_tol=1e-12)


def test_variants_switch_exactly_one_component() -> None:
    base = PolicyParams(tau=0.8)
    assert haco_variant(base, "haco").params == base
    assert haco_variant(base, "wo_env").params.use_env is False
    assert haco_variant(base, "wo_ucb").params.lam == 0.0
    assert haco_variant(base, "wo_lcb").params.use_lcb is False
    assert haco_variant(base, "wo_lcb").params.tau == 0.8
    assert haco_variant(base, "wo_env").name == "wo_env"


def test_unknown_variant_is_rejected() -> None:
    with pytest.raises(InputError, match="wo_magic"):
        haco_variant(PolicyParams(), "wo_magic")


# ---------------------------------------------------------------- (j) determinism


@settings(max_examples=200, deadline=None, database=None)
@given(pools_st, params_st)
def test_same_inputs_give_identical_decision(rows: list[Row], params: PolicyParams) -> None:
    first = allocate(make_stats(rows), params)
    second = allocate(make_stats(rows), params)
    assert (first.size, first.stop, first.p_success) == (second.size, second.stop, second.p_success)
    for name in ALLOCATION_ARRAYS:
        np.testing.assert_array_equal(getattr(first, name), getattr(second, name))
    np.testing.assert_array_equal(first.r_minus, second.r_minus)
    method = haco_variant(params, "haco")
    d1 = method.decide(view_of(rows), np.random.default_rng(1))
    d2 = method.decide(view_of(rows), np.random.default_rng(2))
    assert (d1.members, d1.p_success, d1.stop, d1.u_plus, d1.r_minus) == (
        d2.members,
        d2.p_success,
        d2.stop,
        d2.u_plus,
        d2.r_minus,
    )


@settings(max_examples=150, deadline=None, database=None)
@given(pools_st, pools_st, st.lists(full_params_st, min_size=1, max_size=6))
def test_the_fixed_terms_memo_never_changes_a_decision(
    rows: list[Row], other: list[Row], params_seq: list[PolicyParams]
) -> None:
    # One memo (CandidateArrays.fixed) shared by a pool's statistics, the same statistics
    # sized for another request, and another pool's statistics, decided with parameter
    # sets in turn (more than the memo keeps): each decision is the one fresh statistics
    # give, to the bit.
    base = make_stats(rows)
    sized = dataclasses.replace(base, bytes=base.bytes + 123.0)  # the memo goes along
    stranger = dataclasses.replace(make_stats(other), fixed=base.fixed)
    assert sized.fixed is base.fixed is stranger.fixed
    for params in [*params_seq, *params_seq]:
        for stats in (base, sized, stranger):
            got = allocate(stats, params)
            fresh = allocate(dataclasses.replace(stats, fixed=FixedMemo()), params)
            assert (got.size, got.stop, got.p_success) == (fresh.size, fresh.stop, fresh.p_success)
            for name in (*ALLOCATION_ARRAYS, "r_minus"):
                np.testing.assert_array_equal(getattr(got, name), getattr(fresh, name))


def test_statistics_built_from_columns_keep_their_own_arrays() -> None:
    # The rule's memo knows the arrays by identity, so a caller's array written after
    # from_columns must not reach them.
    alpha = np.array([1.0, 30.0])
    stats = CandidateArrays.from_columns(
        alpha=alpha, beta=[1.0, 1.0], f_int=[0.0, 0.0], loss=[0.0, 0.0], t_proc_s=[1.0, 1.0],
        bytes=[0.0, 0.0], bandwidth_Bps=[math.inf, math.inf], jitter_Bps=[0.0, 0.0],
    )  # fmt: skip
    params = PolicyParams()
    before = allocate(stats, params)
    alpha[:] = [30.0, 1.0]
    after = allocate(stats, params)
    assert stats.alpha is not alpha and list(stats.alpha) == [1.0, 30.0]
    np.testing.assert_array_equal(before.order, after.order)
    np.testing.assert_array_equal(before.u_plus, after.u_plus)
