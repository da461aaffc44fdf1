"""The rule in floats (coordinator.core.smallpool) gives allocate's decision, to the bit."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_policy import FIELDS, full_params_st

from coordinator.core.cofailure import Dependence, Domain
from coordinator.core.methods import Decision, Haco, PoolView
from coordinator.core.params import PolicyParams
from coordinator.core.policy import CandidateArrays, allocate
from coordinator.core.smallpool import SMALL_POOL, Choice, in_floats, in_floats_applies
from schemas.enums import StopReason

row_st = st.tuples(
    st.floats(0.05, 200.0),  # alpha
    st.floats(0.05, 200.0),  # beta
    st.floats(0.0, 1.0),  # f_int
    st.floats(0.0, 1.0),  # loss
    st.one_of(st.just(0.0), st.floats(1e-3, 30.0)),  # t_proc_s (0: a median T of 0)
    st.one_of(st.just(0.0), st.floats(1.0, 1e6)),  # bytes (no subnormals: T / t0 stays finite)
    st.one_of(st.just(math.inf), st.floats(0.0, 1e8)),  # bandwidth_Bps
    st.floats(0.0, 1e7),  # jitter_Bps
    # rtt_s: no subnormals either; a median T of 1e-311 s puts the others' T / t0 past
    # the largest float, a warning in numpy (an error here) and an infinity in Python.
    st.one_of(st.just(0.0), st.floats(1e-6, 0.5)),
)
# Pools drawn from a few templates, so exact U⁺ ties (duplicates) are common; sizes on
# both sides of SMALL_POOL.
pools_st = st.lists(row_st, min_size=1, max_size=4).flatmap(
    lambda templates: st.lists(st.sampled_from(templates), min_size=1, max_size=2 * SMALL_POOL)
)
# test_policy's parameters, with each ablation switch and the RTT term on or off.
params_st = full_params_st.flatmap(
    lambda p: st.builds(
        lambda env, lcb, rtt: p.model_copy(update={"use_env": env, "use_lcb": lcb, "use_rtt": rtt}),
        st.booleans(),
        st.booleans(),
        st.booleans(),
    )
)


def stats_of(rows: list[tuple[float, ...]], rtt: bool) -> CandidateArrays:
    columns: dict[str, object] = {name: [r[i] for r in rows] for i, name in enumerate(FIELDS)}
    if rtt:
        columns["rtt_s"] = [r[-1] for r in rows]
    return CandidateArrays.from_columns(**columns)


FIELDS_OF_DECISION = ("members", "p_success", "stop", "winner_mode", "u_plus", "r_minus")


def decisions(
    stats: CandidateArrays, params: PolicyParams, dep: Dependence | None = None
) -> tuple[Decision, Decision]:
    """(Haco.choose's, Haco.decide's) decision on ``stats``."""
    n = len(stats)
    zeros = np.zeros(n)
    view = PoolView(tuple(f"c{i}" for i in range(n)), ("z",) * n, stats, zeros, zeros, zeros, dep)
    rule = Haco(params)
    return rule.choose(view), rule.decide(view, np.random.default_rng(0))


def same_decision(a: Decision, b: Decision) -> bool:
    return all(getattr(a, f) == getattr(b, f) for f in FIELDS_OF_DECISION)


def allocated(stats: CandidateArrays, params: PolicyParams) -> Choice:
    a = allocate(stats, params)
    m = a.members
    return Choice(
        tuple(int(i) for i in m), a.p_success, a.stop,
        tuple(float(a.u_plus[i]) for i in m), tuple(float(a.r_minus[i]) for i in m),
    )  # fmt: skip


@settings(max_examples=400, deadline=None, database=None)
@given(pools_st, params_st, st.booleans(), st.one_of(st.just(0.0), st.floats(1.0, 1e5)))
def test_floats_give_allocates_decision_bit_for_bit(
    rows: list[tuple[float, ...]], params: PolicyParams, rtt: bool, request_bytes: float
) -> None:
    stats = stats_of(rows, rtt)
    sized = CandidateArrays(  # a view sized for a request, as evidence.for_request makes it
        stats.alpha, stats.beta, stats.f_int, stats.loss, stats.t_proc_s,
        stats.bytes + request_bytes, stats.bandwidth_Bps, stats.jitter_Bps, stats.rtt_s,
        stats.fixed,
    )  # fmt: skip
    for s in (stats, sized):
        expected = allocated(s, params)
        assert in_floats(s, params) == expected  # floats compared with ==: bit for bit
        assert same_decision(*decisions(s, params))


def test_ties_keep_pool_order_and_the_stop_reasons() -> None:
    same = (1.0, 1.0, 0.0, 0.0, 1.0, 0.0, math.inf, 0.0, 0.0)
    stats = stats_of([same] * 5, rtt=False)
    reached = in_floats(stats, PolicyParams(tau=0.5))
    assert reached.members == (0, 1)  # equal U⁺: pool order, as allocate's stable sort
    assert reached.stop is StopReason.TARGET_REACHED
    exhausted = in_floats(stats, PolicyParams(tau=0.99))
    assert exhausted.members == (0, 1, 2, 3, 4)
    assert exhausted.stop is StopReason.POOL_EXHAUSTED
    assert exhausted == allocated(stats, PolicyParams(tau=0.99))


def test_the_fastest_candidate_ranks_first() -> None:
    slow = (1.0, 1.0, 0.0, 0.0, 20.0, 0.0, math.inf, 0.0, 0.0)
    fast = (1.0, 1.0, 0.0, 0.0, 0.5, 0.0, math.inf, 0.0, 0.0)
    c = in_floats(stats_of([slow, fast, slow], rtt=False), PolicyParams(tau=0.2))
    assert c.members == (1,)
    assert c.u_plus[0] > 0


def test_failure_domains_and_large_pools_go_through_allocate() -> None:
    row = (2.0, 1.0, 0.05, 0.0, 1.0, 100.0, 1e6, 0.0, 0.0)
    params = PolicyParams()
    big = stats_of([row] * (SMALL_POOL + 1), rtt=False)
    small = stats_of([row] * 3, rtt=False)
    # With failure domains the rule is coordinator.core.joint's: no float path for it.
    dep = Dependence((Domain("zone:a", (0, 1), 0.3),))
    assert in_floats_applies(len(small), params, None)
    assert not in_floats_applies(len(big), params, None)
    assert not in_floats_applies(len(small), params, dep)
    for stats, d in ((big, None), (small, dep)):
        lean, full = decisions(stats, params, d)
        assert lean.allocation is not None  # allocate's own answer
        assert same_decision(lean, full)


def test_haco_choose_is_decide_without_the_allocation() -> None:
    rows = [
        (3.0, 1.0, 0.1, 0.01, 2.0, 500.0, 1e5, 1e4, 0.0),
        (1.0, 2.0, 0.0, 0.0, 0.5, 500.0, 1e6, 0.0, 0.0),
        (5.0, 5.0, 0.2, 0.0, 1.0, 500.0, math.inf, 0.0, 0.0),
    ]
    lean, full = decisions(stats_of(rows, rtt=False), PolicyParams(tau=0.8))
    assert lean.allocation is None
    assert full.allocation is not None
    assert same_decision(lean, full)
