"""Experience profiles (spec §2 choices, §5): soft counts, failure counts, decay."""

from __future__ import annotations

import math
from functools import reduce

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core.params import DecayUnit, ProfileSettings
from coordinator.core.profiles import (
    CandidateObservation,
    CandidateProfile,
    LinkObservation,
    LinkProfile,
    latency_percentile,
    update_candidate,
    update_link,
)
from coordinator.errors import InputError
from schemas.enums import FailureKind

NEVER = ProfileSettings()


def success(
    at: float = 0.0, q: float | None = 0.8, latency: float | None = 1.0, tokens_out: int = 10
) -> CandidateObservation:
    return CandidateObservation(
        at_s=at, delivered=True, quality=q, proc_latency_s=latency, tokens_out=tokens_out
    )


def internal_failure(at: float = 0.0) -> CandidateObservation:
    return CandidateObservation(
        at_s=at, delivered=True, failure=FailureKind.INTERNAL, proc_latency_s=9.0
    )


def network_failure(at: float = 0.0) -> CandidateObservation:
    return CandidateObservation(at_s=at, delivered=False, failure=FailureKind.NETWORK)


def fold(
    observations: list[CandidateObservation], cfg: ProfileSettings = NEVER
) -> CandidateProfile:
    return reduce(lambda p, o: update_candidate(p, o, cfg), observations, CandidateProfile("c"))


def fold_link(observations: list[LinkObservation], cfg: ProfileSettings = NEVER) -> LinkProfile:
    return reduce(lambda p, o: update_link(p, o, cfg), observations, LinkProfile("a", "b"))


# ---------------------------------------------------------------- soft counts


def test_fresh_profile_is_the_uniform_prior() -> None:
    prof = CandidateProfile("c")
    assert (prof.alpha, prof.beta) == (1.0, 1.0)
    assert prof.f_int == 0.0
    assert prof.mean_quality is None


def test_judged_quality_adds_soft_counts() -> None:
    prof = fold([success(q=0.7)])
    assert prof.alpha == pytest.approx(1.7)
    assert prof.beta == pytest.approx(1.3)
    assert prof.successes == 1.0
    assert prof.mean_quality == pytest.approx(0.7)


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(st.floats(0.0, 1.0), max_size=30))
def test_soft_counts_sum_the_qualities(qualities: list[float]) -> None:
    prof = fold([success(at=float(i), q=q) for i, q in enumerate(qualities)])
    assert prof.alpha == pytest.approx(1.0 + sum(qualities))
    assert prof.beta == pytest.approx(1.0 + sum(1.0 - q for q in qualities))
    assert prof.alpha + prof.beta == pytest.approx(2.0 + len(qualities))


@pytest.mark.parametrize("q", [1.5, -0.5, math.nan])
def test_quality_outside_unit_interval_is_rejected(q: float) -> None:
    with pytest.raises(InputError, match="quality"):
        success(q=q)


def test_internal_failure_of_an_undelivered_call_is_rejected() -> None:
    # f_int = internal failures / delivered calls would exceed 1.
    with pytest.raises(InputError, match="delivered"):
        CandidateObservation(at_s=0.0, delivered=False, failure=FailureKind.INTERNAL)


def test_failures_do_not_touch_the_posterior() -> None:
    before = fold([success(q=0.6)])
    after_internal = update_candidate(before, internal_failure(1.0), NEVER)
    assert (after_internal.alpha, after_internal.beta) == (before.alpha, before.beta)
    assert after_internal.internal_failures == 1.0
    assert after_internal.network_failures == 0.0
    after_network = update_candidate(before, network_failure(1.0), NEVER)
    assert (after_network.alpha, after_network.beta) == (before.alpha, before.beta)
    assert after_network.network_failures == 1.0
    assert after_network.internal_failures == 0.0
    assert after_network.calls == 2.0
    assert after_network.successes == 1.0


def test_failed_call_latency_is_not_recorded() -> None:
    prof = fold([success(latency=2.0), internal_failure()])
    assert prof.latency.mean == pytest.approx(2.0)
    assert prof.recent_latency_s == (2.0,)


def test_f_int_counts_only_delivered_calls() -> None:
    obs = [success(), success(), internal_failure(), network_failure(), network_failure()]
    prof = fold(obs)
    assert prof.calls == 5.0
    assert prof.delivered == 3.0
    assert prof.f_int == pytest.approx(1.0 / 3.0)
    assert prof.success_rate == pytest.approx(2.0 / 5.0)


def test_f_int_is_zero_when_nothing_was_delivered() -> None:
    assert fold([network_failure(), network_failure()]).f_int == 0.0


# ---------------------------------------------------------------- links


def test_link_loss_rate_and_bandwidth() -> None:
    obs = [
        LinkObservation(at_s=0.0, bytes=1000.0, lost=False, t_transfer_s=0.5, rtt_s=0.1),
        LinkObservation(at_s=1.0, bytes=3000.0, lost=False, t_transfer_s=1.0, rtt_s=0.3),
        LinkObservation(at_s=2.0, bytes=5000.0, lost=True),
        LinkObservation(at_s=3.0, bytes=800.0, lost=False, t_transfer_s=0.2),
    ]
    link = fold_link(obs)
    assert link.transmissions == 4.0
    assert link.loss_rate == pytest.approx(0.25)
    samples = [2000.0, 3000.0, 4000.0]  # bytes / transfer time of the delivered ones
    assert link.bandwidth.n == 3.0
    assert link.bandwidth.mean == pytest.approx(3000.0)
    assert link.bandwidth.std == pytest.approx(math.sqrt(sum((s - 3000) ** 2 for s in samples) / 3))
    assert link.rtt.mean == pytest.approx(0.2)


def test_bandwidth_ignores_the_path_delay() -> None:
    # Same link, messages of very different sizes: the bandwidth reading must not vary.
    obs = [
        LinkObservation(at_s=0.0, bytes=100.0, lost=False, t_transfer_s=0.001, rtt_s=0.15),
        LinkObservation(at_s=1.0, bytes=1e6, lost=False, t_transfer_s=10.0, rtt_s=0.15),
    ]
    link = fold_link(obs)
    assert link.bandwidth.mean == pytest.approx(1e5)
    assert link.bandwidth.std == pytest.approx(0.0, abs=1.0)
    assert link.rtt.mean == pytest.approx(0.15)


def test_lost_transmission_gives_no_bandwidth_sample() -> None:
    link = fold_link(
        [LinkObservation(at_s=0.0, bytes=10.0, lost=True, t_transfer_s=5.0, rtt_s=0.4)]
    )
    assert link.loss_rate == 1.0
    assert link.bandwidth.n == 0.0
    assert link.bandwidth.mean is None
    assert link.rtt.mean is None  # a lost message tells nothing about the path delay
    assert LinkProfile("a", "b").loss_rate == 0.0


# ---------------------------------------------------------------- decay


@pytest.mark.parametrize("half_life", [1.0, 4.0, 10.0, 2.5])
def test_count_halves_after_half_life_observations(half_life: float) -> None:
    cfg = ProfileSettings(half_life=half_life)
    steps = math.ceil(half_life)
    prof = fold([internal_failure(), *[success(at=float(i)) for i in range(1, steps + 1)]], cfg)
    assert prof.internal_failures == pytest.approx(0.5 ** (steps / half_life), rel=1e-12)
    if steps == half_life:
        assert prof.internal_failures == pytest.approx(0.5, rel=1e-12)


def test_decayed_posterior_returns_to_prior_not_zero() -> None:
    cfg = ProfileSettings(half_life=3.0)
    prof = fold([success(q=1.0), *[internal_failure(float(i)) for i in range(1, 4)]], cfg)
    assert prof.alpha == pytest.approx(1.0 + 0.5)
    assert prof.beta == pytest.approx(1.0)
    prof = fold([success(q=1.0), *[internal_failure(float(i)) for i in range(1, 200)]], cfg)
    assert prof.alpha == pytest.approx(1.0, abs=1e-12)
    assert prof.alpha >= 1.0
    assert prof.beta == pytest.approx(1.0)


def test_decay_lets_a_recovered_candidate_look_reliable_again() -> None:
    cfg = ProfileSettings(half_life=5.0)
    broken = [internal_failure(float(i)) for i in range(20)]
    recovered = [success(float(i)) for i in range(20, 60)]
    assert fold(broken + recovered, cfg).f_int < 0.01
    assert fold(broken + recovered, NEVER).f_int == pytest.approx(20 / 60)


def test_infinite_half_life_never_forgets() -> None:
    obs = [
        internal_failure(float(i)) if i % 4 == 0 else success(float(i), q=1.0) for i in range(400)
    ]
    prof = fold(obs, ProfileSettings(half_life=math.inf, decay_unit=DecayUnit.SECONDS))
    assert prof.internal_failures == 100.0
    assert prof.calls == 400.0
    assert prof.alpha == 301.0
    assert prof.beta == 1.0
    assert prof.f_int == 0.25


def test_decay_by_seconds_uses_elapsed_time() -> None:
    cfg = ProfileSettings(half_life=10.0, decay_unit=DecayUnit.SECONDS)
    prof = fold([internal_failure(at=100.0), success(at=110.0)], cfg)
    assert prof.internal_failures == pytest.approx(0.5)
    assert prof.calls == pytest.approx(1.5)
    prof = fold([internal_failure(at=100.0), success(at=130.0)], cfg)
    assert prof.internal_failures == pytest.approx(0.125)
    # Several observations at the same instant do not decay each other.
    prof = fold([internal_failure(at=5.0), internal_failure(at=5.0), success(at=5.0)], cfg)
    assert prof.internal_failures == 2.0


def test_link_decays_by_seconds() -> None:
    cfg = ProfileSettings(half_life=2.0, decay_unit=DecayUnit.SECONDS)
    link = fold_link(
        [
            LinkObservation(at_s=0.0, bytes=1.0, lost=True),
            LinkObservation(at_s=4.0, bytes=100.0, lost=False, t_transfer_s=1.0),
        ],
        cfg,
    )
    assert link.losses == pytest.approx(0.25)
    assert link.transmissions == pytest.approx(1.25)
    assert link.loss_rate == pytest.approx(0.2)


# ---------------------------------------------------------------- determinism


def _observation(
    at_s: float,
    delivered: bool,
    failure: FailureKind | None,
    quality: float | None,
    proc: float | None,
    tokens: tuple[int, int],
) -> CandidateObservation:
    # The service can only fail internally on a call it actually received.
    return CandidateObservation(
        at_s=at_s,
        delivered=delivered or failure is FailureKind.INTERNAL,
        failure=failure,
        quality=quality,
        proc_latency_s=proc,
        tokens_in=tokens[0],
        tokens_out=tokens[1],
    )


observation_st = st.builds(
    _observation,
    st.floats(0.0, 1e4),
    st.booleans(),
    st.one_of(st.none(), st.sampled_from(list(FailureKind))),
    st.one_of(st.none(), st.floats(0.0, 1.0)),
    st.one_of(st.none(), st.floats(0.0, 100.0)),
    st.tuples(st.integers(0, 10_000), st.integers(0, 10_000)),
)
settings_st = st.builds(
    ProfileSettings,
    half_life=st.one_of(st.just(math.inf), st.floats(0.5, 1e3)),
    decay_unit=st.sampled_from(list(DecayUnit)),
    latency_window=st.integers(1, 20),
)


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(observation_st, max_size=40), settings_st)
def test_replay_rebuilds_an_equal_profile(
    observations: list[CandidateObservation], cfg: ProfileSettings
) -> None:
    first = fold(observations, cfg)
    second = fold(list(observations), cfg)
    assert first == second
    assert first.observations == len(observations)
    assert first.alpha >= 1.0
    assert first.beta >= 1.0
    assert 0.0 <= first.f_int <= 1.0 + 1e-12
    assert len(first.recent_latency_s) <= cfg.latency_window


# ---------------------------------------------------------------- latency window


def test_latency_percentile_over_the_window() -> None:
    prof = fold([success(float(i), latency=float(x)) for i, x in enumerate([5, 1, 9, 3, 7])])
    assert latency_percentile(prof, 50.0) == 5.0
    assert latency_percentile(prof, 0.0) == 1.0
    assert latency_percentile(prof, 100.0) == 9.0
    assert latency_percentile(prof, 80.0) == 7.0
    assert latency_percentile(prof, 81.0) == 9.0
    assert latency_percentile(CandidateProfile("c"), 50.0) is None


def test_latency_window_is_capped() -> None:
    cfg = ProfileSettings(latency_window=3)
    prof = fold([success(float(i), latency=float(i)) for i in range(1, 11)], cfg)
    assert prof.recent_latency_s == (8.0, 9.0, 10.0)
    assert latency_percentile(prof, 0.0) == 8.0
    assert latency_percentile(prof, 100.0) == 10.0
    # The running mean still covers every observation; only the percentile window is capped.
    assert prof.latency.mean == pytest.approx(5.5)


def test_latency_window_setting_is_bounded() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        ProfileSettings(latency_window=0)
    with pytest.raises(ValidationError):
        ProfileSettings(half_life=0.0)
