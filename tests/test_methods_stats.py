"""Baselines (spec §7) and the profile -> policy-array bridge with cold starts (spec §2)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from coordinator.core.evidence import PoolMember, build_arrays, link_id
from coordinator.core.methods import (
    BASELINES,
    BestOne,
    BestOnePaper,
    MixtureOfAgents,
    PoolView,
    RandomOne,
)
from coordinator.core.params import PolicyParams, ProfileSettings
from coordinator.core.policy import CandidateArrays, allocate
from coordinator.core.profiles import CandidateProfile, LinkProfile, Moments
from schemas.enums import StopReason, WinnerMode

FIELDS = ("alpha", "beta", "f_int", "loss", "t_proc_s", "bytes", "bandwidth_Bps", "jitter_Bps")


def cold_view(
    n: int,
    calls: list[float] | None = None,
    success_rate: list[float] | None = None,
    mean_quality: list[float] | None = None,
) -> PoolView:
    stats = CandidateArrays.from_columns(
        alpha=[1.0] * n,
        beta=[1.0] * n,
        f_int=[0.0] * n,
        loss=[0.0] * n,
        t_proc_s=[1.0] * n,
        bytes=[0.0] * n,
        bandwidth_Bps=[math.inf] * n,
        jitter_Bps=[0.0] * n,
    )
    return PoolView(
        ids=[f"c{i}" for i in range(n)],
        zones=["local"] * n,
        stats=stats,
        calls=np.asarray(calls if calls is not None else [0.0] * n, dtype=np.float64),
        success_rate=np.asarray(success_rate or [0.0] * n, dtype=np.float64),
        mean_quality=np.asarray(mean_quality or [0.0] * n, dtype=np.float64),
    )


# ---------------------------------------------------------------- RandomOne


def test_random_one_is_uniform() -> None:
    rng = np.random.default_rng(20240601)
    view = cold_view(6)
    method = RandomOne()
    counts: Counter[int] = Counter()
    for _ in range(6000):
        decision = method.decide(view, rng)
        assert len(decision.members) == 1
        counts[decision.members[0]] += 1
    assert set(counts) == set(range(6))
    for index in range(6):
        assert 850 <= counts[index] <= 1150, counts


def test_random_one_is_a_single_route() -> None:
    decision = RandomOne().decide(cold_view(3), np.random.default_rng(1))
    assert decision.stop is StopReason.SINGLE_ROUTE
    assert decision.winner_mode is WinnerMode.FIRST
    again = RandomOne().decide(cold_view(3), np.random.default_rng(1))
    assert again == decision


# ---------------------------------------------------------------- BestOne


def test_paper_bestone_keeps_the_route_best_after_warm_up() -> None:
    rng = np.random.default_rng(0)
    method = BestOnePaper(p_exp=0.0)
    warm = cold_view(3, calls=[2, 2, 2], success_rate=[1.0, 1.0, 1.0], mean_quality=[0.5, 0.8, 0.6])
    assert method.decide(warm, rng).members == (1,)
    # Candidate 1 then fails every call: the adaptive BestOne leaves it, the paper's
    # keeps it.
    broken = cold_view(
        3, calls=[2, 40, 2], success_rate=[1.0, 0.05, 1.0], mean_quality=[0.5, 0.8, 0.6]
    )
    assert method.decide(broken, rng).members == (1,)
    assert BestOne(p_exp=0.0).decide(broken, rng).members == (2,)
    # The warm-up comes first, as for the adaptive variant.
    assert BestOnePaper().decide(cold_view(3, calls=[2, 1, 2]), rng).members == (1,)


def test_best_one_tries_least_tried_first_during_cold_start() -> None:
    rng = np.random.default_rng(0)
    assert BestOne().decide(cold_view(6, calls=[1, 0, 2, 0, 5, 1]), rng).members == (1,)
    assert BestOne().decide(cold_view(4, calls=[2, 2, 1, 3]), rng).members == (2,)


def test_best_one_tries_each_candidate_n_min_times_before_exploiting() -> None:
    rng = np.random.default_rng(7)
    calls = [0.0, 0.0, 0.0]
    quality = [0.2, 0.9, 0.5]
    picks = []
    for _ in range(6):
        view = cold_view(3, calls=calls, success_rate=[1.0] * 3, mean_quality=quality)
        (index,) = BestOne(p_exp=1.0).decide(view, rng).members
        picks.append(index)
        calls[index] += 1
    assert picks == [0, 1, 2, 0, 1, 2]
    view = cold_view(3, calls=calls, success_rate=[1.0] * 3, mean_quality=quality)
    assert BestOne(p_exp=0.0).decide(view, rng).members == (1,)


def test_best_one_scores_quality_times_success_rate() -> None:
    view = cold_view(
        3, calls=[10, 10, 10], success_rate=[0.5, 1.0, 0.9], mean_quality=[0.9, 0.7, 0.6]
    )
    decision = BestOne(p_exp=0.0).decide(view, np.random.default_rng(0))
    assert decision.members == (1,)  # 0.45, 0.70, 0.54
    assert decision.stop is StopReason.SINGLE_ROUTE


def test_best_one_explores_with_probability_p_exp() -> None:
    n = 6
    view = cold_view(
        n,
        calls=[5.0] * n,
        success_rate=[0.9, 0.8, 1.0, 0.7, 0.9, 0.5],
        mean_quality=[0.5, 0.6, 0.9, 0.8, 0.4, 0.9],
    )
    best = 2
    rng = np.random.default_rng(12345)
    method = BestOne()
    assert method.p_exp == 0.1
    assert method.n_min == 2
    differ = sum(method.decide(view, rng).members != (best,) for _ in range(5000))
    # Exploration picks uniformly, so it lands on the best one 1/n of the time.
    expected = 5000 * 0.1 * (n - 1) / n
    assert 0.75 * expected <= differ <= 1.25 * expected


# ---------------------------------------------------------------- MoA


def test_mixture_of_agents_takes_the_whole_pool_and_waits_for_the_best() -> None:
    decision = MixtureOfAgents().decide(cold_view(5), np.random.default_rng(0))
    assert decision.members == (0, 1, 2, 3, 4)
    assert decision.winner_mode is WinnerMode.BEST
    assert decision.stop is StopReason.FULL_POOL


def test_baseline_registry_builds_each_method() -> None:
    names = {name: factory().name for name, factory in BASELINES.items()}
    assert names == {
        "random": "random",
        "bestone": "bestone",
        "bestone-paper": "bestone-paper",
        "moa": "moa",
    }


# ---------------------------------------------------------------- stats.build_arrays


def profile(cid: str, latencies: list[float], tokens_out: float | None = None) -> CandidateProfile:
    latency = Moments(float(len(latencies)), sum(latencies), sum(x * x for x in latencies))
    tokens = Moments() if tokens_out is None else Moments(1.0, tokens_out, tokens_out**2)
    return CandidateProfile(
        cid,
        alpha=3.0,
        beta=2.0,
        calls=5.0,
        delivered=4.0,
        internal_failures=1.0,
        latency=latency,
        tokens_out=tokens,
    )


def link(dst: str, samples: list[float], losses: float = 0.0, sent: float = 10.0) -> LinkProfile:
    bw = Moments(float(len(samples)), sum(samples), sum(x * x for x in samples))
    return LinkProfile("local", dst, transmissions=sent, losses=losses, bandwidth=bw)


def members(*zones: str) -> list[PoolMember]:
    return [PoolMember(f"c{i}", zone) for i, zone in enumerate(zones)]


def test_link_id_is_directional() -> None:
    assert link_id("local", "global") == "local->global"
    assert link_id("global", "local") != link_id("local", "global")


def test_cold_pool_gets_cold_defaults_and_a_free_network() -> None:
    cfg = ProfileSettings()
    arrays = build_arrays(members("local", "regional", "global"), "local", {}, {}, 500.0, cfg)
    assert arrays.alpha.tolist() == [1.0] * 3
    assert arrays.beta.tolist() == [1.0] * 3
    assert arrays.f_int.tolist() == [0.0] * 3
    assert arrays.loss.tolist() == [0.0] * 3
    assert arrays.t_proc_s.tolist() == [cfg.cold_t_proc_s] * 3 == [1.0] * 3
    assert arrays.bandwidth_Bps.tolist() == [math.inf] * 3
    assert arrays.bytes.tolist() == [500.0] * 3
    alloc = allocate(arrays, PolicyParams())
    assert alloc.T_s.tolist() == arrays.t_proc_s.tolist()


def test_cold_t_proc_setting_is_used() -> None:
    cfg = ProfileSettings(cold_t_proc_s=2.5)
    arrays = build_arrays(members("local"), "local", {}, {}, 0.0, cfg)
    assert arrays.t_proc_s.tolist() == [2.5]


@pytest.mark.parametrize(
    ("known", "expected"),
    [([[1.0], [3.0]], 2.0), ([[1.0], [2.0, 2.0], [10.0]], 2.0), ([[4.0, 6.0]], 5.0)],
)
def test_unseen_candidate_gets_median_of_known_means(
    known: list[list[float]], expected: float
) -> None:
    pool = members(*["local"] * (len(known) + 1))
    profiles = {f"c{i}": profile(f"c{i}", lat) for i, lat in enumerate(known)}
    arrays = build_arrays(pool, "local", profiles, {}, 0.0, ProfileSettings())
    assert arrays.t_proc_s[-1] == pytest.approx(expected)
    assert arrays.f_int[-1] == 0.0
    assert arrays.alpha[-1] == 1.0
    for i, lat in enumerate(known):
        assert arrays.t_proc_s[i] == pytest.approx(sum(lat) / len(lat))
        assert arrays.f_int[i] == pytest.approx(0.25)
        assert (arrays.alpha[i], arrays.beta[i]) == (3.0, 2.0)


def test_seen_candidate_without_latency_gets_the_default() -> None:
    profiles = {"c0": profile("c0", []), "c1": profile("c1", [4.0])}
    arrays = build_arrays(members("local", "local"), "local", profiles, {}, 0.0, ProfileSettings())
    assert arrays.t_proc_s.tolist() == [4.0, 4.0]


def test_unobserved_link_gets_median_of_known_links() -> None:
    links = {
        link_id("local", "a"): link("a", [100.0, 100.0]),
        link_id("local", "b"): link("b", [200.0, 400.0]),
        link_id("local", "c"): link("c", [1000.0, 3000.0]),
        link_id("local", "d"): link("d", [], losses=2.0, sent=8.0),  # only losses seen
    }
    pool = members("a", "b", "c", "d", "e")
    arrays = build_arrays(pool, "local", {}, links, 0.0, ProfileSettings())
    assert arrays.bandwidth_Bps.tolist() == [100.0, 300.0, 2000.0, 300.0, 300.0]
    assert arrays.jitter_Bps.tolist() == pytest.approx([0.0, 100.0, 1000.0, 100.0, 100.0])
    assert arrays.loss.tolist() == [0.0, 0.0, 0.0, 0.25, 0.0]


def test_links_are_looked_up_from_the_caller_zone() -> None:
    links = {link_id("regional", "global"): link("global", [50.0], losses=5.0, sent=10.0)}
    from_local = build_arrays(members("global"), "local", {}, links, 0.0, ProfileSettings())
    assert from_local.loss.tolist() == [0.0]
    assert from_local.bandwidth_Bps.tolist() == [math.inf]
    from_regional = build_arrays(members("global"), "regional", {}, links, 0.0, ProfileSettings())
    assert from_regional.loss.tolist() == [0.5]
    assert from_regional.bandwidth_Bps.tolist() == [50.0]


def test_bytes_are_request_plus_expected_output() -> None:
    profiles = {"c0": profile("c0", [1.0], tokens_out=100.0)}
    cfg = ProfileSettings(bytes_per_token=4.0)
    arrays = build_arrays(members("local", "local"), "local", profiles, {}, 250.0, cfg)
    assert arrays.bytes.tolist() == [650.0, 250.0]


def test_built_arrays_are_valid_policy_input() -> None:
    from coordinator.core.policy import validate

    links = {link_id("local", "global"): link("global", [1e6], losses=1.0, sent=4.0)}
    profiles = {"c1": profile("c1", [2.0], tokens_out=50.0)}
    arrays = build_arrays(
        members("local", "global", "global"), "local", profiles, links, 1e3, ProfileSettings()
    )
    validate(arrays)
    for name in FIELDS:
        assert getattr(arrays, name).shape == (3,)
    assert allocate(arrays, PolicyParams()).size >= 1
