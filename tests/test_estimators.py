"""The learned estimates converge to the simulator's truth, and track a change.

Unit tests first (which legs count towards the loss rate, the robust bandwidth window,
its merge and encoding, a late member), then long simulated runs: on the overall
scenario the learned f_int, link loss, bandwidth and processing latency are within
sampling error of what the scenario configures; on network degradation the learned
Local–Global loss goes to its new value and the improved Local–Regional bandwidth is
picked up without the effective bandwidth b − κj ever reaching the ε_B floor.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from functools import reduce

import numpy as np
import pytest

from coordinator.core.evidence import PoolMember, build_arrays, link_id
from coordinator.core.observations import observations
from coordinator.core.params import PolicyParams, ProfileSettings
from coordinator.core.profile_merge import merge_link
from coordinator.core.profiles import (
    MAD_TO_STD,
    LinkObservation,
    LinkProfile,
    Moments,
    robust_center_spread,
    update_link,
    update_link_many,
)
from coordinator.errors import InputError
from coordinator.state.codec import decode_link, encode
from schemas.enums import FailureKind, MemberStatus
from schemas.models import link_key
from schemas.scenario import LognormalLatency, NetworkSpec
from sim.candidates import CallDraw, SimModel, link_observations, simulate_call
from sim.engine import Simulation
from sim.memberdraw import sim_trace
from sim.network import LinkState
from sim.runner import build_method, pools_for
from sim.scenario import load_builtin
from sim.workflow import datawise_task
from sim.world import SimWorld

NEVER = ProfileSettings()
SMALL = ProfileSettings(bandwidth_window=4)


def leg(
    at: float, bps: float | None, lost: bool = False, can_be_lost: bool = True
) -> LinkObservation:
    """A transmission of 1000 bytes at ``bps`` bytes/s (None: no transfer time)."""
    transfer = None if bps is None else 1000.0 / bps
    return LinkObservation(at, 1000.0, lost, transfer, 0.125, can_be_lost)  # exact in binary


# ---------------------------------------------------------------- which legs count


def test_only_legs_that_can_be_lost_count_towards_the_loss_rate() -> None:
    legs = [leg(0.0, None, lost=True), leg(1.0, 1e5), leg(1.0, 2e5, can_be_lost=False)]
    prof = update_link_many(LinkProfile("a", "b"), legs, NEVER)
    assert (prof.transmissions, prof.losses) == (2.0, 1.0)
    assert prof.loss_rate == 0.5
    # ... while every delivered leg gives bandwidth and RTT
    assert prof.bandwidth.n == 2.0 and prof.rtt.n == 2.0
    assert prof.recent_bandwidth_Bps == pytest.approx((1e5, 2e5))
    assert prof.observations == 3


def test_a_lost_leg_must_be_one_that_can_be_lost() -> None:
    with pytest.raises(InputError, match="can_be_lost"):
        leg(0.0, None, lost=True, can_be_lost=False)


def _draw(lossy_legs: str) -> CallDraw:
    net = NetworkSpec(lossy_legs=lossy_legs)  # type: ignore[arg-type]
    model = SimModel("m", load_builtin("overall").models["gpt-4o"])
    rng = np.random.default_rng(3)
    link = LinkState(100.0, 10.0, 50.0, 0.0)
    return simulate_call(model, 0.0, link, 2_000.0, net, rng)


@pytest.mark.parametrize(("lossy_legs", "response_trial"), [("request", False), ("both", True)])
def test_the_simulators_response_leg_is_a_trial_only_when_responses_can_be_lost(
    lossy_legs: str, response_trial: bool
) -> None:
    draw = _draw(lossy_legs)
    assert draw.failure is None and draw.response is not None
    net = NetworkSpec(lossy_legs=lossy_legs)  # type: ignore[arg-type]
    req, resp = link_observations(draw, 5.0, net)
    assert req.can_be_lost and resp.can_be_lost is response_trial
    assert (req.bytes, resp.bytes) == (draw.request.bytes, draw.response.bytes)
    assert resp.t_transfer_s == draw.response.t_tx_s  # its bandwidth still counts


@pytest.mark.parametrize("lossy_legs", ["request", "both"])
def test_the_learned_loss_rate_of_many_calls_is_the_links(lossy_legs: str) -> None:
    """Fold the legs of many simulated calls: the loss rate is the link's p. Counting
    every response leg as a trial (the old rule) gives about p / (2 − p) with lossy
    requests only, which the tolerance (4 binomial standard errors) excludes."""
    p = 0.3
    net = NetworkSpec(lossy_legs=lossy_legs)  # type: ignore[arg-type]
    model = SimModel("m", load_builtin("overall").models["gpt-4o"])
    rng = np.random.default_rng(11)
    link = LinkState(100.0, 10.0, 50.0, p)
    prof, old_rule = LinkProfile("a", "b"), LinkProfile("a", "b")
    for i in range(3_000):
        legs = link_observations(simulate_call(model, 0.0, link, 2_000.0, net, rng), i, net)
        prof = update_link_many(prof, legs, NEVER)
        everything = [LinkObservation(o.at_s, o.bytes, o.lost, o.t_transfer_s) for o in legs]
        old_rule = update_link_many(old_rule, everything, NEVER)
    se = math.sqrt(p * (1 - p) / prof.transmissions)
    assert abs(prof.loss_rate - p) < 4 * se
    if lossy_legs == "request":
        assert prof.transmissions == 3_000  # one trial per call
        assert old_rule.loss_rate == pytest.approx(p / (2 - p), abs=4 * se)


# ---------------------------------------------------------------- the robust window


def test_median_and_spread_of_a_window() -> None:
    assert robust_center_spread([5.0]) == (5.0, 0.0)
    # |x − 3| = 2, 1, 0, 1, 97: the outlier moves neither the centre nor the spread much
    assert robust_center_spread([1.0, 2.0, 3.0, 4.0, 100.0]) == (3.0, MAD_TO_STD * 1.0)
    # even length: the lower median, an observed value
    assert robust_center_spread([4.0, 1.0, 3.0, 2.0]) == (2.0, MAD_TO_STD * 1.0)


def test_the_spread_estimates_a_normal_deviation() -> None:
    x = np.random.default_rng(0).normal(1e6, 5e4, 20_000)
    center, spread = robust_center_spread(list(x))
    assert center == pytest.approx(1e6, rel=0.005)
    assert spread == pytest.approx(5e4, rel=0.05)


def test_a_step_in_bandwidth_switches_the_estimate_at_half_the_window() -> None:
    """Old value 100, new 300, window 8: the estimate is 100 with no spread while at most
    half the window is new, then 300 with no spread; b − κj never drops below 100."""
    cfg = ProfileSettings(bandwidth_window=8)
    prof = reduce(lambda p, i: update_link(p, leg(i, 100.0), cfg), range(20), LinkProfile("a", "b"))
    for k in range(1, 12):
        prof = update_link(prof, leg(20 + k, 300.0), cfg)
        b, j = prof.bandwidth_estimate or (math.nan, math.nan)
        assert (b, j) == ((100.0, 0.0) if k <= 4 else (300.0, 0.0)), k
        assert b - PolicyParams().kappa * j >= 100.0
    assert len(prof.recent_bandwidth_Bps) == 8
    # The moments, kept for display, read this step as a very jittery link.
    mean, std = prof.bandwidth.mean, prof.bandwidth.std
    assert mean is not None and mean - 2 * std < 100.0


def test_a_lost_or_untimed_leg_adds_nothing_to_the_window() -> None:
    prof = update_link_many(LinkProfile("a", "b"), [leg(0, 10.0), leg(1, None, lost=True)], NEVER)
    prof = update_link(prof, LinkObservation(2.0, 10.0, False, None, 0.1), NEVER)
    assert prof.recent_bandwidth_Bps == pytest.approx((10.0,))


def test_the_window_is_trimmed_when_folded_and_when_merged() -> None:
    base = update_link_many(
        LinkProfile("a", "b"), [leg(i, 10.0 * (i + 1)) for i in range(6)], SMALL
    )
    assert base.recent_bandwidth_Bps == pytest.approx((30.0, 40.0, 50.0, 60.0))
    delta = update_link_many(LinkProfile("a", "b"), [leg(10 + i, 1e3 + i) for i in range(2)], SMALL)
    merged = merge_link(base, delta, SMALL)
    assert merged is not None
    assert merged.recent_bandwidth_Bps == pytest.approx((50.0, 60.0, 1e3, 1e3 + 1))
    # merge(fold(P), fold(S)) = fold(P + S), the window too
    everything = [leg(i, 10.0 * (i + 1)) for i in range(6)] + [
        leg(10 + i, 1e3 + i) for i in range(2)
    ]
    assert merged == update_link_many(LinkProfile("a", "b"), everything, SMALL)
    assert merge_link(None, delta, SMALL) == delta
    assert merge_link(base, LinkProfile("a", "b"), SMALL) == base


def test_the_window_survives_encoding_and_an_old_value_decodes() -> None:
    prof = update_link_many(LinkProfile("a", "b"), [leg(0, 1e5), leg(1, 3e5)], NEVER)
    back = decode_link(encode(prof))
    assert back == prof and isinstance(back.recent_bandwidth_Bps, tuple)
    # A value stored before the window existed: the policy falls back to the moments.
    old = json.loads(encode(prof))
    del old["recent_bandwidth_Bps"]
    legacy = decode_link(json.dumps(old))
    assert legacy.recent_bandwidth_Bps == ()
    assert legacy.bandwidth_estimate == (prof.bandwidth.mean, prof.bandwidth.std)
    assert LinkProfile("a", "b").bandwidth_estimate is None


def test_the_policy_reads_the_windows_median_and_spread() -> None:
    link = LinkProfile(
        "local", "far", bandwidth=Moments(3.0, 30.0, 500.0), recent_bandwidth_Bps=(9.0, 10.0, 14.0)
    )
    pool = [PoolMember("c", "far")]
    arrays = build_arrays(pool, "local", {}, {link_id("local", "far"): link}, 100.0, NEVER)
    assert arrays.bandwidth_Bps[0] == 10.0
    assert arrays.jitter_Bps[0] == pytest.approx(MAD_TO_STD * 1.0)


# ---------------------------------------------------------------- a late member


def _success(world: SimWorld, cand_id: str) -> CallDraw:
    cand = next(c for c in world.scenario.candidates if c.id == cand_id)
    rng = np.random.default_rng(5)
    while True:
        draw = world.call(cand, 2_000.0, rng)
        if draw.failure is None:
            return draw


def test_a_late_success_is_harvested_as_a_timeout_with_its_link_legs() -> None:
    scenario = load_builtin("overall")
    world = SimWorld(scenario)
    sim = Simulation(world, pools_for("haco", scenario, world), build_method(
        "haco", scenario, PolicyParams()), np.random.default_rng(0))  # fmt: skip
    cand = next(c for c in scenario.candidates if c.id == "coder-global-1")
    draw = _success(world, cand.id)
    trace = sim_trace(cand, "local", draw, 0.9, 200.0, late=True)
    assert trace.failure_kind is FailureKind.TIMEOUT and trace.status is MemberStatus.TIMED_OUT
    assert trace.quality is None and trace.proc_latency_s is None and not trace.success
    obs, _ = observations(trace)
    assert obs is not None and obs.delivered and obs.failure is FailureKind.INTERNAL
    sim._harvest(cand, draw, 0.9, 200.0, True)
    prof = sim.candidates[cand.id]
    assert (prof.calls, prof.successes, prof.internal_failures) == (1.0, 0.0, 1.0)
    assert prof.latency.n == 0.0 and prof.quality.n == 0.0 and prof.alpha == prof.beta == 1.0
    link = sim.links[link_id("local", "global")]
    assert (link.transmissions, link.losses, link.bandwidth.n) == (1.0, 0.0, 2.0)
    # on time, the same draw is a success
    sim._harvest(cand, draw, 0.9, 201.0, False)
    assert sim.candidates[cand.id].successes == 1.0


def test_no_success_finishes_after_the_deadline() -> None:
    """With a deadline shorter than many calls, the profiles never learn a success (nor
    its processing latency) from a member that finished after it; those are timeouts."""
    scenario = load_builtin("overall")
    _, world, sim = drive(scenario, 20, seed=1, deadline_s=3.0)
    late = 0.0
    for prof in sim.candidates.values():
        assert all(x <= 3.0 for x in prof.recent_latency_s), prof.candidate_id
        late += prof.internal_failures
    expected_internal = sum(
        prof.delivered * world.failure_rate[cid] for cid, prof in sim.candidates.items()
    )
    assert late > 2 * expected_internal + 10  # many late members counted as failures


# ---------------------------------------------------------------- long runs


def drive(
    scenario: object,
    tasks: int,
    seed: int = 0,
    settings: ProfileSettings | None = None,
    after_task: Callable[[int, Simulation], None] | None = None,
    deadline_s: float | None = None,
) -> tuple[object, SimWorld, Simulation]:
    """sim.runner.run's loop, keeping the simulation to look at its profiles."""
    from schemas.scenario import Scenario

    assert isinstance(scenario, Scenario)
    world = SimWorld(scenario)
    if deadline_s is not None:
        world.deadline_s = deadline_s
    method = build_method("haco", scenario, PolicyParams())
    rng = np.random.default_rng([seed, 1])
    sim = Simulation(world, pools_for("haco", scenario, world), method, rng, settings)
    work_rng = np.random.default_rng([seed, 2])
    for task in range(tasks):
        world.apply_changes(task)
        sim.task = task
        sim.now_s += scenario.workload.task_gap_s
        ctl = datawise_task(scenario.workload, work_rng, scenario.network.bytes_per_token)
        try:
            inv = next(ctl)
            while True:
                inv = ctl.send(sim.invoke(inv))
        except StopIteration:
            pass
        if after_task is not None:
            after_task(task, sim)
    sim.finish()
    return scenario, world, sim


@pytest.fixture(scope="module")
def overall() -> tuple[SimWorld, Simulation]:
    _, world, sim = drive(load_builtin("overall"), 400, seed=4)
    return world, sim


# Tolerances: 4 standard errors of the estimate from its own observations (binomial for
# rates, the lognormal's standard deviation / √n for means). The runs are seeded, so this
# is no flakiness margin but what an unbiased estimator meets and a biased one (like the
# old p / (2 − p) loss, 0.014 against 0.03 on Local–Global with ~10⁴ trials, 9 standard
# errors off) does not. Only estimates with enough observations are checked: a candidate
# the policy rarely picks has a wide interval and says little.
SE_BOUND = 4.0


def test_f_int_converges_to_each_candidates_failure_rate(
    overall: tuple[SimWorld, Simulation],
) -> None:
    world, sim = overall
    checked = 0
    for cid, prof in sim.candidates.items():
        if prof.delivered < 300:
            continue
        f = world.failure_rate[cid]
        se = math.sqrt(f * (1 - f) / prof.delivered)
        assert abs(prof.f_int - f) < SE_BOUND * se, (cid, prof.f_int, f)
        checked += 1
    assert checked >= 8


def test_link_loss_converges_to_each_links_loss(overall: tuple[SimWorld, Simulation]) -> None:
    world, sim = overall
    checked = 0
    for lid, prof in sim.links.items():
        if prof.transmissions < 1_000:
            continue
        p = world.links[link_key(prof.src, prof.dst)].loss
        se = math.sqrt(p * (1 - p) / prof.transmissions)
        assert abs(prof.loss_rate - p) < SE_BOUND * se, (lid, prof.loss_rate, p)
        checked += 1
    assert checked >= 2  # Local–Regional and Local–Global


def test_bandwidth_converges_to_each_links_bandwidth(overall: tuple[SimWorld, Simulation]) -> None:
    """The simulator's transfer time is bytes / bandwidth exactly, so the learned
    bandwidth is the configured one up to floating-point rounding, with no spread."""
    world, sim = overall
    bpt = world.scenario.network.bytes_per_token
    assert len(sim.links) == 3
    for lid, prof in sim.links.items():
        truth = bpt * world.links[link_key(prof.src, prof.dst)].bandwidth_tokens_per_ms * 1000
        estimate = prof.bandwidth_estimate
        assert estimate is not None, lid
        assert estimate[0] == pytest.approx(truth, rel=1e-9), lid
        assert estimate[1] == pytest.approx(0.0, abs=1e-9 * truth), lid


def test_processing_latency_converges_to_each_models_mean(
    overall: tuple[SimWorld, Simulation],
) -> None:
    world, sim = overall
    by_model: dict[str, Moments] = {}
    for cid, prof in sim.candidates.items():
        m = by_model.get(world.model_of[cid], Moments())
        by_model[world.model_of[cid]] = Moments(
            m.n + prof.latency.n, m.s1 + prof.latency.s1, m.s2 + prof.latency.s2
        )
    checked = 0
    for model, lat in by_model.items():
        spec = world.scenario.models[model].latency
        assert isinstance(spec, LognormalLatency)
        if lat.n < 100:
            continue
        mean = spec.median_s * math.exp(spec.sigma**2 / 2)
        sd = mean * math.sqrt(math.exp(spec.sigma**2) - 1)
        assert lat.mean is not None
        assert abs(lat.mean - mean) < SE_BOUND * sd / math.sqrt(lat.n), (model, lat.mean, mean)
        checked += 1
    assert checked >= 2


def test_estimates_track_the_network_degradation() -> None:
    """At task 50 Local–Global loses everything and Local–Regional triples its bandwidth.
    With a half-life the learned loss goes to 1; the bandwidth estimate switches from the
    old value to the new one once half its window is new, and b − κj never falls below
    the old bandwidth (the moments' mean − κ·std does go negative: the bug this fixes)."""
    scenario = load_builtin("network_degradation")
    cfg = ProfileSettings(half_life=100.0)
    kappa = PolicyParams().kappa
    bpt = scenario.network.bytes_per_token
    old_bw, new_bw = bpt * 50 * 1000, bpt * 150 * 1000
    seen: list[tuple[int, float, float, int, float]] = []

    def look(task: int, sim: Simulation) -> None:
        reg = sim.links["local->regional"]
        b, j = reg.bandwidth_estimate or (math.nan, math.nan)
        new = sum(1 for x in reg.recent_bandwidth_Bps if x > 2 * old_bw)
        mean = reg.bandwidth.mean or 0.0
        seen.append((task, b, b - kappa * j, new, mean - kappa * reg.bandwidth.std))

    _, _, sim = drive(scenario, 150, seed=0, settings=cfg, after_task=look)
    window = cfg.bandwidth_window
    for task, b, effective, new, _ in seen:
        assert effective >= old_bw * (1 - 1e-9), task
        want = new_bw if new > window // 2 else old_bw
        assert b == pytest.approx(want, rel=1e-9), (task, new)
    assert seen[-1][1] == pytest.approx(new_bw, rel=1e-9)
    assert any(moments_eff <= 0 for *_, moments_eff in seen)
    # Every call to Global after the change is lost, so the estimate climbs towards 1;
    # how close it gets depends on how many calls HACO still sends there (it stops
    # doing so as the loss rises), hence a bound far from the old 0.03, not a value.
    assert sim.links["local->global"].loss_rate > 0.85
    before = [row for row in seen if row[0] < 50]
    assert all(b == pytest.approx(old_bw, rel=1e-9) for _, b, *_ in before)
