"""Experience profiles (spec §5): pure, deterministic updates from member outcomes.

A profile is an immutable value; ``update_*`` returns a new one. Replaying the same
observations in the same order rebuilds the same profile, which is what lets a
recomputation from stored traces agree with the online profiles.

Every count decays with a half-life measured in observations of that profile or in
seconds; ``half_life = inf`` (the default) never forgets, as in the paper. Decay pulls
the Beta posterior back towards its prior ``Beta(1, 1)``, not towards zero.

Merging a delta onto a snapshot: :mod:`coordinator.core.profile_merge`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from coordinator.core.params import DecayUnit, ProfileSettings
from coordinator.core.percentiles import nearest_rank
from coordinator.errors import InputError
from schemas.enums import FailureKind

PRIOR_ALPHA = 1.0
PRIOR_BETA = 1.0


@dataclass(frozen=True, slots=True)
class Moments:
    """Decayed weighted sums: weight, Σx, Σx². Mean and deviation derive from them."""

    n: float = 0.0
    s1: float = 0.0
    s2: float = 0.0

    def add(self, x: float, w: float) -> Moments:
        return Moments(self.n * w + 1.0, self.s1 * w + x, self.s2 * w + x * x)

    def scaled(self, w: float) -> Moments:
        return Moments(self.n * w, self.s1 * w, self.s2 * w)

    def plus(self, x: float, weight: float) -> Moments:
        """One more value with ``weight``, without decaying what is there."""
        return Moments(self.n + weight, self.s1 + weight * x, self.s2 + weight * x * x)

    @property
    def mean(self) -> float | None:
        return self.s1 / self.n if self.n > 0 else None

    @property
    def std(self) -> float:
        if self.n <= 0:
            return 0.0
        m = self.s1 / self.n
        return math.sqrt(max(0.0, self.s2 / self.n - m * m))


@dataclass(frozen=True, slots=True)
class CandidateObservation:
    """What one executed member tells about its candidate."""

    at_s: float
    delivered: bool  # False when the transmission was lost before the candidate saw it
    failure: FailureKind | None = None  # None = success
    quality: float | None = None  # judged quality in [0, 1] of a successful output
    proc_latency_s: float | None = None
    tokens_in: int = 0
    tokens_out: int = 0

    def __post_init__(self) -> None:
        if self.failure is FailureKind.INTERNAL and not self.delivered:
            # f_int = internal failures / delivered calls: an internal failure of a call
            # the service never received would push it above 1.
            raise InputError("an internal failure needs delivered=True: the service saw the call")
        if self.quality is not None and not 0.0 <= self.quality <= 1.0:
            raise InputError(f"quality={self.quality!r}; expected a judged score in [0, 1]")
        if self.proc_latency_s is not None and not self.proc_latency_s >= 0.0:
            raise InputError(f"proc_latency_s={self.proc_latency_s!r}; expected >= 0")
        if self.tokens_in < 0 or self.tokens_out < 0:
            raise InputError(
                f"tokens_in={self.tokens_in}, tokens_out={self.tokens_out}; expected >= 0"
            )


@dataclass(frozen=True, slots=True)
class LinkObservation:
    """One transmission over a link: its size, whether it was lost, and its timing split
    into the transfer part (bytes / bandwidth) and the path delay (the RTT signal)."""

    at_s: float
    bytes: float
    lost: bool
    t_transfer_s: float | None = None  # bytes / bandwidth, when delivered
    rtt_s: float | None = None
    # Whether this transmission could have been lost, i.e. whether it counts towards the
    # loss rate. A leg that cannot be lost (the simulator's response leg when only
    # requests are lossy) still gives bandwidth and RTT, but counting it in the loss
    # denominator would bias the rate down to about p / (2 − p).
    can_be_lost: bool = True

    def __post_init__(self) -> None:
        if self.lost and not self.can_be_lost:
            raise InputError("a lost transmission needs can_be_lost=True")


@dataclass(frozen=True, slots=True)
class CandidateProfile:
    candidate_id: str
    alpha: float = PRIOR_ALPHA
    beta: float = PRIOR_BETA
    calls: float = 0.0
    delivered: float = 0.0
    successes: float = 0.0
    internal_failures: float = 0.0
    network_failures: float = 0.0
    deadline_failures: float = 0.0
    quality: Moments = Moments()
    latency: Moments = Moments()
    tokens_in: Moments = Moments()
    tokens_out: Moments = Moments()
    recent_latency_s: tuple[float, ...] = ()
    observations: int = 0
    last_seen_s: float | None = None

    @property
    def f_int(self) -> float:
        """Internal failure rate among calls the candidate actually received."""
        return self.internal_failures / self.delivered if self.delivered > 0 else 0.0

    @property
    def success_rate(self) -> float:
        return self.successes / self.calls if self.calls > 0 else 0.0

    @property
    def mean_quality(self) -> float | None:
        return self.quality.mean


@dataclass(frozen=True, slots=True)
class LinkProfile:
    src: str
    dst: str
    transmissions: float = 0.0
    losses: float = 0.0
    bandwidth: Moments = Moments()  # observed bytes / transfer time, bytes/s (display)
    rtt: Moments = Moments()
    # The newest bandwidth observations (bytes/s, oldest first), at most
    # ``ProfileSettings.bandwidth_window``: the policy's bandwidth and jitter come from
    # them (:func:`robust_center_spread`), not from the never-forgetting moments above.
    recent_bandwidth_Bps: tuple[float, ...] = ()
    observations: int = 0
    last_seen_s: float | None = None

    @property
    def loss_rate(self) -> float:
        """Losses among the transmissions that could be lost (``can_be_lost``)."""
        return self.losses / self.transmissions if self.transmissions > 0 else 0.0

    @property
    def bandwidth_estimate(self) -> tuple[float, float] | None:
        """(bandwidth, jitter) in bytes/s for the policy: the median and the robust spread
        of the recent window; the moments' mean and std for a profile without a window
        (stored before the window existed); None when no bandwidth was observed."""
        if self.recent_bandwidth_Bps:
            return robust_center_spread(self.recent_bandwidth_Bps)
        mean = self.bandwidth.mean
        return None if mean is None else (mean, self.bandwidth.std)


MAD_TO_STD = 1.4826
"""1 / Φ⁻¹(3/4): the median absolute deviation times this estimates σ of a normal."""


def robust_center_spread(values: Sequence[float]) -> tuple[float, float]:
    """(median, 1.4826 × median absolute deviation) of ``values`` (not empty).

    Both medians are the *lower* median (an observed value, the ⌈n/2⌉-th smallest), not
    the mean of the two middle ones: across a step change the window holds two regimes,
    and averaging them when they are exactly half and half would give a centre between
    them and a spread of half the step (κ = 2 times that puts an improved link on the
    ε_B floor). With the lower median the estimate switches from the old value to the
    new one, and the spread stays that of the majority regime."""
    ordered = sorted(values)
    mid = (len(ordered) - 1) // 2
    center = ordered[mid]
    # |x − centre| without abs: two ascending runs, which the sort merges in one pass.
    below = [center - x for x in reversed(ordered[: mid + 1])]
    deviations = sorted(below + [x - center for x in ordered[mid + 1 :]])
    return center, MAD_TO_STD * deviations[mid]


def decay_weight(settings: ProfileSettings, last_seen_s: float | None, now_s: float) -> float:
    """Factor applied to existing counts before one new observation is added."""
    if math.isinf(settings.half_life) or last_seen_s is None:
        return 1.0
    if settings.decay_unit is DecayUnit.OBSERVATIONS:
        return float(0.5 ** (1.0 / settings.half_life))
    elapsed = max(0.0, now_s - last_seen_s)
    return float(0.5 ** (elapsed / settings.half_life))


def update_candidate(
    profile: CandidateProfile, obs: CandidateObservation, settings: ProfileSettings
) -> CandidateProfile:
    """Fold one member outcome into its candidate's profile (spec §2 choices hold:
    failures do not touch the Beta posterior; they count towards f_int or ℓ_net)."""
    w = decay_weight(settings, profile.last_seen_s, obs.at_s)
    alpha = PRIOR_ALPHA + (profile.alpha - PRIOR_ALPHA) * w
    beta = PRIOR_BETA + (profile.beta - PRIOR_BETA) * w
    quality = profile.quality.scaled(w)
    if obs.failure is None and obs.quality is not None:
        alpha += obs.quality
        beta += 1.0 - obs.quality
        quality = profile.quality.add(obs.quality, w)
    latency = profile.latency.scaled(w)
    recent = profile.recent_latency_s
    if obs.proc_latency_s is not None and obs.failure is None:
        latency = profile.latency.add(obs.proc_latency_s, w)
        recent = (*recent, obs.proc_latency_s)[-settings.latency_window :]
    tokens_out = profile.tokens_out.scaled(w)
    if obs.failure is None:
        tokens_out = profile.tokens_out.add(float(obs.tokens_out), w)
    return replace(
        profile,
        alpha=alpha,
        beta=beta,
        calls=profile.calls * w + 1.0,
        delivered=profile.delivered * w + (1.0 if obs.delivered else 0.0),
        successes=profile.successes * w + (1.0 if obs.failure is None else 0.0),
        internal_failures=profile.internal_failures * w
        + (1.0 if obs.failure is FailureKind.INTERNAL else 0.0),
        network_failures=profile.network_failures * w
        + (1.0 if obs.failure is FailureKind.NETWORK else 0.0),
        deadline_failures=profile.deadline_failures * w
        + (1.0 if obs.failure is FailureKind.DEADLINE else 0.0),
        quality=quality,
        latency=latency,
        tokens_in=profile.tokens_in.add(float(obs.tokens_in), w),
        tokens_out=tokens_out,
        recent_latency_s=recent,
        observations=profile.observations + 1,
        last_seen_s=obs.at_s,
    )


def apply_quality(
    profile: CandidateProfile, q: float, settings: ProfileSettings, at_s: float
) -> CandidateProfile:
    """Fold a late judgement (the judge queue) into the Beta posterior: ``α += q``,
    ``β += 1 − q`` (spec §2) and the quality moments, nothing else. The call itself was
    counted when its member reported (``update_candidate`` without a quality), so calls,
    failures, latency and ``last_seen_s`` stay as they are and no decay step is taken.

    The judgement belongs to the call that finished at ``at_s``: with a half-life in
    seconds it weighs what that call's observation weighs now, ``0.5^((last_seen − at_s)
    / half_life)`` (1 when ``at_s`` is not older than the profile); with a half-life in
    observations it weighs 1 (how many observations followed is not tracked)."""
    if not 0.0 <= q <= 1.0:
        raise InputError(f"quality={q!r}; expected a judged score in [0, 1]")
    w = 1.0
    last = profile.last_seen_s
    if settings.decay_unit is DecayUnit.SECONDS and last is not None and at_s < last:
        w = decay_weight(settings, at_s, last)
    return replace(
        profile,
        alpha=profile.alpha + w * q,
        beta=profile.beta + w * (1.0 - q),
        quality=profile.quality.plus(q, w),
    )


def update_link(
    profile: LinkProfile, obs: LinkObservation, settings: ProfileSettings
) -> LinkProfile:
    """Fold one transmission into a link profile. A transmission that could be lost
    (``can_be_lost``) counts towards the loss rate, lost or not; a delivered one gives a
    bandwidth observation bytes / transfer time (into the moments and the recent window)
    whether it could have been lost or not.

    The path delay is kept apart (``rtt``) on purpose: bytes / (transfer + path delay)
    depends on the message size, so messages of different sizes would read as bandwidth
    jitter and the κ-penalty of Eq. 7 would swamp every other term."""
    w = decay_weight(settings, profile.last_seen_s, obs.at_s)
    bandwidth = profile.bandwidth.scaled(w)
    recent = profile.recent_bandwidth_Bps
    if not obs.lost and obs.t_transfer_s is not None and obs.t_transfer_s > 0:
        bps = obs.bytes / obs.t_transfer_s
        bandwidth = profile.bandwidth.add(bps, w)
        recent = (*recent, bps)[-settings.bandwidth_window :]
    rtt = profile.rtt.scaled(w)
    if obs.rtt_s is not None and not obs.lost:
        rtt = profile.rtt.add(obs.rtt_s, w)
    lossy = 1.0 if obs.can_be_lost else 0.0
    return replace(
        profile,
        transmissions=profile.transmissions * w + lossy,
        losses=profile.losses * w + (1.0 if obs.lost else 0.0),
        bandwidth=bandwidth,
        rtt=rtt,
        recent_bandwidth_Bps=recent,
        observations=profile.observations + 1,
        last_seen_s=obs.at_s,
    )


def update_link_many(
    profile: LinkProfile, observations: Sequence[LinkObservation], settings: ProfileSettings
) -> LinkProfile:
    """Fold several transmissions (a call's request and response legs) in order."""
    for obs in observations:
        profile = update_link(profile, obs, settings)
    return profile


def latency_percentile(profile: CandidateProfile, q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]) over the recent latency window."""
    if not profile.recent_latency_s:
        return None
    return nearest_rank(profile.recent_latency_s, q)
