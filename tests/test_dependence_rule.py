"""The dependence-aware stopping rule (issue 10): co-failure evidence, the joint failure
model and the allocation that uses them."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_policy import make_stats, params_st, pools_st

from coordinator.core.cofailure import (
    CoFailure,
    Dependence,
    Domain,
    Member,
    PairStats,
    dependence,
    failure_score,
    fold_group,
    fold_groups,
    merge,
)
from coordinator.core.joint import JointModel, joint_model
from coordinator.core.params import DecayUnit, PolicyParams, ProfileSettings
from coordinator.core.policy import CandidateArrays, allocate
from coordinator.core.profiles import decay_weight
from coordinator.errors import InputError
from schemas.enums import StopReason

SETTINGS = ProfileSettings()


def warm(quality: float, n: float = 400.0, f_int: float = 0.0) -> tuple[float, ...]:
    """A row of a candidate judged ``n`` times at mean ``quality`` (tight posterior)."""
    return (1.0 + quality * n, 1.0 + (1.0 - quality) * n, f_int, 0.0, 1.0, 0.0, math.inf, 0.0)


def domains_st(n: int) -> st.SearchStrategy[Dependence]:
    member_sets = st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True)
    dom = st.tuples(member_sets, st.floats(0.0, 0.6))
    return st.lists(dom, min_size=0, max_size=5).map(
        lambda ds: Dependence(
            tuple(Domain(f"d{k}", tuple(sorted(m)), c) for k, (m, c) in enumerate(ds))
        )
    )


def brute_force(fail: np.ndarray, dep: Dependence, members: list[int]) -> float:
    """P(all members fail) by enumerating every shock pattern of every domain."""
    survive = np.ones_like(fail)
    for d in dep.domains:
        for i in d.members:
            survive[i] *= 1.0 - d.shock
    resid = np.clip(1.0 - (1.0 - fail) / np.where(survive > 0, survive, 1.0), 0.0, 1.0)
    resid = np.where(survive > 0, resid, 1.0)
    total = 0.0
    for pattern in itertools.product((False, True), repeat=len(dep.domains)):
        w = math.prod(
            d.shock if a else 1.0 - d.shock for d, a in zip(dep.domains, pattern, strict=True)
        )
        hit = {i for d, a in zip(dep.domains, pattern, strict=True) if a for i in d.members}
        total += w * math.prod(1.0 if i in hit else float(resid[i]) for i in members)
    return total


# ---------------------------------------------------------------- the joint model


@settings(max_examples=150, deadline=None, database=None)
@given(st.data())
def test_joint_model_equals_enumeration_of_every_shock_pattern(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 6))
    fail = np.array(data.draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n)))
    dep = data.draw(domains_st(n))
    members = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
    model = JointModel(fail, dep, max_domains=16)
    want = brute_force(fail, dep, members)
    subset = np.array(members, dtype=np.intp)
    assert model.p_all_fail(subset) == pytest.approx(want, abs=1e-9)  # the product table
    assert model.p_all_fail_closed(subset) == pytest.approx(want, abs=1e-9)


@settings(max_examples=150, deadline=None, database=None)
@given(st.data())
def test_the_product_table_gives_every_prefix_and_every_extension_exactly(
    data: st.DataObject,
) -> None:
    """JointModel's vectorized forms (every prefix of an order; a set plus each member)
    agree with p_all_fail one set at a time, and so with the enumeration above."""
    n = data.draw(st.integers(1, 7))
    fail = np.array(data.draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n)))
    dep = data.draw(domains_st(n))
    order = np.array(data.draw(st.permutations(range(n))), dtype=np.intp)
    model = JointModel(fail, dep, max_domains=16)
    one_by_one = [model.p_all_fail(order[: k + 1]) for k in range(n)]
    assert model.p_all_fail_prefixes(order) == pytest.approx(one_by_one, abs=1e-12)
    chosen = order[: data.draw(st.integers(1, n))]
    each = model.p_all_fail_with_each(chosen)
    if any(d.shock > 0 for d in dep.domains):
        assert each is not None
        for j in range(n):
            want = model.p_all_fail(np.array([*chosen, j], dtype=np.intp))
            assert each[j] == pytest.approx(want, abs=1e-12)
    else:  # no shock to enumerate: the caller takes p_all_fail one by one
        assert each is None


@settings(max_examples=100, deadline=None, database=None)
@given(st.data())
def test_merging_domains_past_the_cap_never_understates_joint_failure(
    data: st.DataObject,
) -> None:
    n = data.draw(st.integers(2, 6))
    fail = np.array(data.draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n)))
    dep = data.draw(domains_st(n))
    members = np.arange(n, dtype=np.intp)
    exact = JointModel(fail, dep, max_domains=16).p_all_fail(members)
    capped = JointModel(fail, dep, max_domains=1).p_all_fail(members)
    assert capped >= exact - 1e-12


@pytest.mark.parametrize("domains", [3, 9])  # 8 patterns; 512, taken member by member
def test_every_prefix_from_the_table_is_each_prefix_set_alone(domains: int) -> None:
    rng = np.random.default_rng(domains)
    n = 40
    fail = rng.uniform(0.0, 0.6, n)
    dep = Dependence(
        tuple(
            Domain(f"d{k}", tuple(sorted(set(rng.integers(0, n, 12).tolist()))), 0.1)
            for k in range(domains)
        )
    )
    model = JointModel(fail, dep, max_domains=10)
    order = rng.permutation(n).astype(np.intp)
    one_by_one = [model.p_all_fail_closed(order[: k + 1]) for k in range(n)]
    assert model.p_all_fail_prefixes(order) == pytest.approx(one_by_one, rel=1e-9, abs=1e-15)


def test_a_snapshots_domain_table_serves_every_model_of_its_pool() -> None:
    dep = Dependence((Domain("zone:a", (0, 1), 0.2), Domain("model:m", (1, 2), 0.0)))
    first = JointModel(np.array([0.3, 0.4, 0.5]), dep, 10)
    later = JointModel(np.array([0.2, 0.4, 0.6]), dep, 10)  # R⁻ after a profile changed
    assert later.member is first.member  # the domains' part, worked out once
    assert first.shock.tolist() == [0.2]  # a domain without a shock is left out
    assert Dependence(dep.domains) == dep  # the table is not part of the value
    members = np.array([0, 1], dtype=np.intp)
    assert later.p_all_fail(members) == pytest.approx(later.p_all_fail_closed(members))
    assert later.p_all_fail(members) != pytest.approx(first.p_all_fail(members))


def test_a_snapshot_keeps_the_joint_model_of_each_views_r_minus() -> None:
    r_minus = np.array([0.7, 0.6, 0.5])
    dep = Dependence((Domain("zone:a", (0, 1), 0.2),))
    model = joint_model(dep, r_minus, 10)
    assert joint_model(dep, r_minus, 10) is model  # the next plan on the same view
    assert model.fail.tolist() == pytest.approx([0.3, 0.4, 0.5])
    newer = np.array([0.7, 0.6, 0.4])  # a view built after a profile changed
    assert joint_model(dep, newer, 10) is not model
    assert joint_model(dep, r_minus, 10) is model  # the last two are kept
    assert joint_model(dep, r_minus, 1) is not model  # another cap, another model
    other = Dependence((Domain("zone:a", (0, 1), 0.3),))  # the next snapshot's
    assert joint_model(other, r_minus, 10) is not model


# ---------------------------------------------------------------- the rule


def _greedy_one_by_one(
    ranked: np.ndarray, fail: np.ndarray, u_plus: np.ndarray, model: JointModel, size: int
) -> list[int]:
    """The rule's greedy choice as its definition reads, one candidate at a time: the
    next member maximises U⁺ · (P(S fails) − P(S and it fail)) / (P(S fails) · (1 − F)),
    the first of scores within a relative 1e-9 in U⁺ order."""
    chosen = [int(ranked[0])]
    left = [int(c) for c in ranked[1:]]
    p_fail = model.p_all_fail(np.array(chosen, dtype=np.intp))
    while len(chosen) < size and left:
        best, best_score, best_p = left[0], -1.0, p_fail
        each = model.p_all_fail_with_each(np.array(chosen, dtype=np.intp))
        for j in left:
            if each is not None:
                p_with = float(each[j])
            else:
                p_with = model.p_all_fail(np.array([*chosen, j], dtype=np.intp))
            survive = 1.0 - fail[j]
            rescue = (p_fail - p_with) / (p_fail * survive) if p_fail > 0 and survive > 0 else 0.0
            score = float(u_plus[j]) * rescue
            if score > best_score * (1.0 + 1e-9) + 1e-15:
                best, best_score, best_p = j, score, p_with
        chosen.append(best)
        left.remove(best)
        p_fail = best_p
    return chosen


def _random_pool(seed: int) -> tuple[CandidateArrays, Dependence, PolicyParams]:
    """A pool of 1-30 candidates of their own qualities, up to 12 random domains, a
    random τ and cap: sets worth diversifying are common, unlike in pools_st."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 31))
    q, m = rng.uniform(0.2, 0.99, n), rng.uniform(2.0, 400.0, n)
    if seed % 4 == 0:  # equal candidates: ties everywhere
        q[:], m[:] = q[0], m[0]
    stats = CandidateArrays.from_columns(
        alpha=1 + q * m, beta=1 + (1 - q) * m,
        f_int=rng.uniform(0.0, 0.3, n) * (rng.uniform(size=n) < 0.5), loss=np.zeros(n),
        t_proc_s=rng.uniform(0.5, 3.0, n), bytes=np.full(n, 1000.0),
        bandwidth_Bps=np.full(n, 1e6), jitter_Bps=np.zeros(n),
    )  # fmt: skip
    domains = tuple(
        Domain(
            f"d{k}",
            tuple(sorted(set(rng.integers(0, n, int(rng.integers(1, n + 1))).tolist()))),
            float(rng.uniform(0.0, 0.5)),
        )
        for k in range(int(rng.integers(1, 13)))
    )
    params = PolicyParams(
        tau=float(rng.uniform(0.8, 0.999)),
        max_enumerated_domains=int(rng.integers(1, 17)),
        unreachable_members="saturate" if seed % 3 == 0 else "pool",
    )
    return stats, Dependence(domains), params


@settings(max_examples=300, deadline=None, database=None)
@given(st.integers(0, 2**32 - 1))
@example(204)  # past the cap no score above -1 at a step: the set's P(all fail) is kept
@example(672)
def test_the_rule_takes_the_members_its_one_by_one_definition_takes(seed: int) -> None:
    """The rule scores every candidate at once (issue 12); the set, its order and its
    probability are those of the greedy's definition, candidate by candidate, on the
    same joint model."""
    stats, dep, params = _random_pool(seed)
    got = allocate(stats, params, dep)
    model = JointModel(1.0 - got.r_minus, dep, params.max_enumerated_domains)
    ranked = np.argsort(-got.u_plus, kind="stable")
    want = _greedy_one_by_one(ranked, model.fail, got.u_plus, model, got.size)
    prefix = 1.0 - model.p_all_fail_prefixes(ranked)
    if 1.0 - model.p_all_fail(np.array(want, dtype=np.intp)) > prefix[got.size - 1] + 1e-12:
        assert got.diversified
        assert got.members.tolist() == sorted(want, key=ranked.tolist().index)
        p = 1.0 - model.p_all_fail_prefixes(got.order)[got.size - 1]
        assert got.p_success == p
    else:
        assert not got.diversified
        assert got.members.tolist() == ranked[: got.size].tolist()
        assert got.p_success == prefix[got.size - 1]


@settings(max_examples=200, deadline=None, database=None)
@given(pools_st, params_st)
def test_rule_reduces_to_the_papers_without_dependence(
    rows: list[tuple[float, ...]], params: PolicyParams
) -> None:
    stats = make_stats(rows)  # type: ignore[arg-type]
    n = len(stats)
    paper = allocate(stats, params.model_copy(update={"use_dependence": False}))
    domains = (Domain("request", tuple(range(n)), 0.0), Domain("zone:a", (0,), 0.0))
    for dep in (None, Dependence(()), Dependence(domains)):
        got = allocate(stats, params, dep)
        assert got.members.tolist() == paper.members.tolist()
        assert got.p_success == paper.p_success
        assert got.stop is paper.stop
        assert got.p_success_indep == paper.p_success


def _stats_and_dep(data: st.DataObject) -> tuple[CandidateArrays, Dependence, PolicyParams]:
    rows = data.draw(pools_st)
    stats = make_stats(rows)
    dep = data.draw(domains_st(len(stats)))
    params = data.draw(params_st)
    return stats, dep, params


def _scaled(dep: Dependence, factor: float) -> Dependence:
    return Dependence(
        tuple(Domain(d.name, d.members, min(0.99, d.shock * factor)) for d in dep.domains)
    )


@settings(max_examples=200, deadline=None, database=None)
@given(st.data())
def test_never_less_conservative_than_the_papers_rule(data: st.DataObject) -> None:
    stats, dep, params = _stats_and_dep(data)
    paper = allocate(stats, params.model_copy(update={"use_dependence": False}))
    got = allocate(stats, params, dep)
    assert got.p_success <= got.p_success_indep + 1e-12
    assert got.size >= paper.size


@settings(max_examples=200, deadline=None, database=None)
@given(st.data(), st.floats(1.0, 5.0))
def test_more_co_failure_never_lowers_the_members_needed(data: st.DataObject, k: float) -> None:
    stats, dep, params = _stats_and_dep(data)
    low = allocate(stats, params, dep)
    high = allocate(stats, params, _scaled(dep, k))
    assert high.size >= low.size


def test_correlation_inside_a_zone_diversifies_across_zones() -> None:
    # Three strong members of zone a rank first, two weaker ones of zone b after them.
    rows = [warm(0.8), warm(0.8), warm(0.8), warm(0.7), warm(0.7)]
    stats = make_stats(rows)  # type: ignore[arg-type]
    params = PolicyParams(tau=0.96)
    assert allocate(stats, params).members.tolist() == [0, 1, 2]
    dep = Dependence((Domain("zone:a", (0, 1, 2), 0.1),))
    got = allocate(stats, params, dep)
    # Zone a's shared brownouts: its prefix of three no longer reaches τ, and the
    # members taken are spread over both zones rather than the U⁺ prefix of four.
    assert got.size == 4
    assert got.diversified
    assert sorted(got.members.tolist()) == [0, 1, 3, 4]
    model = JointModel(1.0 - got.r_minus, dep, 10)
    assert 1.0 - model.p_all_fail(got.members) == pytest.approx(got.p_success)
    assert got.p_success > 1.0 - model.p_all_fail(np.array([0, 1, 2, 3]))
    assert got.p_success < got.p_success_indep


def test_a_cause_every_member_shares_makes_the_target_unreachable() -> None:
    stats = make_stats([warm(0.8)] * 6)  # type: ignore[list-item]
    params = PolicyParams(tau=0.9)
    assert allocate(stats, params).stop is StopReason.TARGET_REACHED
    dep = Dependence((Domain("request", tuple(range(6)), 0.2),))
    got = allocate(stats, params, dep)
    assert got.stop is StopReason.TARGET_UNREACHABLE
    assert got.achievable <= 0.8 + 1e-12
    assert got.size == 6  # default: the whole pool, as when a pool falls short
    cheap = allocate(stats, params.model_copy(update={"unreachable_members": "saturate"}), dep)
    assert cheap.stop is StopReason.TARGET_UNREACHABLE
    assert cheap.size < 6
    assert cheap.p_success >= cheap.achievable - params.unreachable_slack


def test_a_pool_too_small_without_shared_cause_is_exhausted_not_unreachable() -> None:
    stats = make_stats([warm(0.5), warm(0.5)])  # type: ignore[list-item]
    dep = Dependence((Domain("zone:a", (0, 1), 0.05),))
    got = allocate(stats, PolicyParams(tau=0.95), dep)
    assert got.stop is StopReason.POOL_EXHAUSTED


# ---------------------------------------------------------------- the evidence


def _members() -> list[Member]:
    return [
        Member("a1", "a", "m1"),
        Member("a2", "a", "m2"),
        Member("b1", "b", "m1"),
        Member("b2", "b", "m2"),
    ]


def _simulate(
    rng: np.random.Generator, groups: int, zone_shock: float, req_shock: float
) -> CoFailure:
    ev = CoFailure()
    pool = _members()
    for g in range(groups):
        req = rng.random() < req_shock
        zone_a = rng.random() < zone_shock
        outcomes = []
        for m in pool:
            fail = req or (m.zone == "a" and zone_a) or rng.random() < 0.2
            outcomes.append((m.candidate_id, failure_score(not fail, None)))
        ev = fold_group(ev, outcomes, float(g), SETTINGS)
    return ev


def test_zone_co_failure_is_attributed_to_the_zone() -> None:
    ev = _simulate(np.random.default_rng(1), 3000, zone_shock=0.3, req_shock=0.0)
    dep = dependence(_members(), ev, SETTINGS)
    assert dep is not None
    shocks = {d.name: d.shock for d in dep.domains}
    assert shocks["zone:a"] == pytest.approx(0.3, abs=0.06)
    assert shocks["request"] < 0.02
    assert "zone:b" not in shocks or shocks["zone:b"] < 0.02


def test_request_hardness_is_attributed_to_the_request() -> None:
    ev = _simulate(np.random.default_rng(2), 3000, zone_shock=0.0, req_shock=0.1)
    dep = dependence(_members(), ev, SETTINGS)
    assert dep is not None
    shocks = {d.name: d.shock for d in dep.domains}
    assert shocks["request"] == pytest.approx(0.1, abs=0.03)


def test_independent_outcomes_give_almost_no_shock_and_thin_evidence_none() -> None:
    ev = _simulate(np.random.default_rng(3), 3000, zone_shock=0.0, req_shock=0.0)
    dep = dependence(_members(), ev, SETTINGS)
    assert dep is not None
    assert max(d.shock for d in dep.domains) < 0.02
    assert dependence(_members(), CoFailure(), SETTINGS) is None
    # Five groups where everything failed together: the prior keeps the shock modest.
    few = _simulate(np.random.default_rng(4), 5, zone_shock=1.0, req_shock=0.0)
    thin = dependence(_members(), few, SETTINGS)
    assert thin is None or max(d.shock for d in thin.domains) < 0.5


def test_merge_of_folds_equals_one_fold() -> None:
    rng = np.random.default_rng(5)
    decayed = ProfileSettings(half_life=50.0, decay_unit=DecayUnit.OBSERVATIONS)
    groups = [[(m.candidate_id, float(rng.random() < 0.3)) for m in _members()] for _ in range(40)]
    for prof in (SETTINGS, decayed):
        whole = CoFailure()
        for t, g in enumerate(groups):
            whole = fold_group(whole, g, float(t), prof)
        head, tail = CoFailure(), CoFailure()
        for t, g in enumerate(groups[:25]):
            head = fold_group(head, g, float(t), prof)
        for t, g in enumerate(groups[25:], start=25):
            tail = fold_group(tail, g, float(t), prof)
        merged = merge(head, tail, prof)
        for key, p in whole.pairs.items():
            q = merged.pairs[key]
            assert (q.n, q.s_a, q.s_b, q.s_ab) == pytest.approx((p.n, p.s_a, p.s_b, p.s_ab))


def _groups_with_retries(seed: int) -> list[tuple[list[tuple[str, float]], float]]:
    rng = np.random.default_rng(seed)
    ids = [f"c{i}" for i in range(6)]
    groups = []
    for t in range(300):
        picked = [str(c) for c in rng.choice(ids, size=int(rng.integers(1, 5)))]
        groups.append(([(c, float(rng.choice([0.0, 1.0, rng.random()]))) for c in picked], t * 0.7))
    return groups


@pytest.mark.parametrize("unit", list(DecayUnit))
def test_the_fold_without_decay_gives_the_decayed_folds_floats_at_weight_one(
    unit: DecayUnit,
) -> None:
    """No decay and a half-life so long that every weight is exactly 1 fold to the same
    floats, from a start, with retries and groups of one candidate among the groups."""
    groups = _groups_with_retries(9)
    endless = ProfileSettings(half_life=1e308, decay_unit=unit)
    assert endless.half_life < math.inf
    start = fold_groups(CoFailure(), groups[:50], endless)
    plain = fold_groups(start, groups[50:], SETTINGS)
    decayed = fold_groups(start, groups[50:], endless)
    assert plain.pairs == decayed.pairs and len(plain.pairs) > 10


def _one_pairstats_per_step(
    evidence: CoFailure, groups: list[tuple[list[tuple[str, float]], float]], prof: ProfileSettings
) -> dict[tuple[str, str], PairStats]:
    """The fold as the definition reads: a new PairStats per pair and group."""
    pairs = dict(evidence.pairs)
    for outcomes, at_s in groups:
        by_id = dict(outcomes)  # a retried candidate: its last score
        ids = sorted(by_id)
        for a, b in itertools.combinations(ids, 2):
            old = pairs.get((a, b)) or PairStats()
            w = decay_weight(prof, old.last_seen_s, at_s)
            pa, pb = by_id[a], by_id[b]
            sums = (old.n * w + 1.0, old.s_a * w + pa, old.s_b * w + pb, old.s_ab * w + pa * pb)
            pairs[(a, b)] = PairStats(*sums, old.observations + 1, at_s)
    return pairs


@pytest.mark.parametrize(
    "prof",
    [SETTINGS, ProfileSettings(half_life=30.0, decay_unit=DecayUnit.OBSERVATIONS),
     ProfileSettings(half_life=40.0, decay_unit=DecayUnit.SECONDS)],
    ids=["none", "observations", "seconds"],
)  # fmt: skip
def test_the_in_place_fold_is_the_fold_by_definition_to_the_bit(prof: ProfileSettings) -> None:
    groups = _groups_with_retries(11)
    start = fold_groups(CoFailure(), groups[:40], prof)
    assert start.pairs == _one_pairstats_per_step(CoFailure(), groups[:40], prof)
    got = fold_groups(start, groups[40:], prof)
    assert got.pairs == _one_pairstats_per_step(start, groups[40:], prof)


def test_failure_scores_and_bad_input() -> None:
    assert failure_score(False, None) == 1.0
    assert failure_score(True, None) == 0.0
    assert failure_score(True, 0.75) == 0.25
    with pytest.raises(InputError, match=r"quality=1\.5"):
        failure_score(True, 1.5)
    with pytest.raises(InputError, match="failure score 2"):
        fold_group(CoFailure(), [("a", 2.0), ("b", 0.0)], 0.0, SETTINGS)
    one = fold_group(CoFailure(), [("a", 1.0), ("a", 1.0)], 0.0, SETTINGS)
    assert not one.pairs


def test_a_shared_endpoint_across_zones_and_models_is_a_domain() -> None:
    pool = [
        Member("p", "eu", "m1", "api.example.com"),
        Member("q", "us", "m2", "api.example.com"),
        Member("r", "ap", "m3", "other.example.com"),
    ]
    rng = np.random.default_rng(6)
    ev = CoFailure()
    for g in range(3000):
        down = rng.random() < 0.25  # the shared host is down for this request
        outcomes = []
        for m in pool:
            fail = (down and m.endpoint == "api.example.com") or rng.random() < 0.15
            outcomes.append((m.candidate_id, failure_score(not fail, None)))
        ev = fold_group(ev, outcomes, float(g), SETTINGS)
    dep = dependence(pool, ev, SETTINGS)
    assert dep is not None
    shocks = {d.name: d for d in dep.domains}
    assert shocks["endpoint:api.example.com"].shock == pytest.approx(0.25, abs=0.06)
    assert shocks["endpoint:api.example.com"].members == (0, 1)
    assert shocks["request"].shock < 0.02


def _shared_cause(pool: list[Member], hit: set[str], seed: int) -> CoFailure:
    """3 000 groups of the whole pool: the members in ``hit`` fail together a quarter of
    the time; everyone also fails alone 15% of the time."""
    rng = np.random.default_rng(seed)
    ev = CoFailure()
    for g in range(3000):
        down = rng.random() < 0.25
        outcomes = []
        for m in pool:
            fail = (down and m.candidate_id in hit) or rng.random() < 0.15
            outcomes.append((m.candidate_id, failure_score(not fail, None)))
        ev = fold_group(ev, outcomes, float(g), SETTINGS)
    return ev


SITES = [Member(f"{z}{m}{k}", z, m) for z in ("a", "b") for m in ("x", "y") for k in (1, 2)]


@pytest.mark.parametrize(
    ("hit", "domain", "members"),
    [
        ({"ax1", "ax2", "bx1", "bx2"}, "model:x", (0, 1, 4, 5)),  # a model's outage
        ({"ay1", "ay2"}, "site:a/y", (2, 3)),  # one zone's copy of a model
        ({"ax1", "by2"}, "pair:ax1|by2", (0, 7)),  # two that share nothing else
    ],
)
def test_co_failure_is_attributed_to_what_the_members_share(
    hit: set[str], domain: str, members: tuple[int, ...]
) -> None:
    prof = SETTINGS.model_copy(update={"cofail_pair_min_groups": 1000})
    dep = dependence(SITES, _shared_cause(SITES, hit, 7), prof)
    assert dep is not None
    shocks = {d.name: d for d in dep.domains}
    assert shocks[domain].members == members
    assert shocks[domain].shock == pytest.approx(0.25, abs=0.07)
    others = [d.shock for d in dep.domains if d.name != domain]
    assert max(others) < 0.05


def test_the_runtime_reads_a_candidates_endpoint_host() -> None:
    from coordinator.runtime.pool import endpoint_host
    from schemas.models import BackendSpec, Candidate

    sim = Candidate(id="a", role="coder", model="m", zone="eu")
    assert endpoint_host(sim) == ""
    real = sim.model_copy(
        update={
            "backend": BackendSpec(
                kind="openai", settings={"base_url": "https://api.example.com:8443/v1"}
            )
        }
    )
    assert endpoint_host(real) == "api.example.com"
