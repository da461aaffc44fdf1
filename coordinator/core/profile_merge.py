"""Merging experience profiles (spec §5): :func:`merge_candidate`, :func:`merge_link`.

The online profiles are kept as *deltas*, profiles folded from an empty start over one
epoch's observations only, on top of a snapshot recomputed from the trace store
(coordinator.tracestore.recompute). ``merge(fold(P), fold(S))`` equals ``fold(P + S)``
when S's observations all come after P's:

- half-life ∞: exactly (sums add; floats up to rounding);
- half-life in observations: exactly too — the base's counts decay by ``w`` once per
  observation of the delta, ``w^n`` in all, and the delta's own counts were decayed as
  they were folded;
- half-life in seconds: the base decays by ``0.5^(max(0, last(S) − last(P)) / h)``. The
  fold decays step by step with ``max(0, Δt)`` per step, which is the same product when
  observation times do not go backwards in fold order; when they do (workers' clocks,
  a slow report), the merge forgets the base a little less than the fold, by at most the
  time the order goes backwards. That is the one approximation.
"""

from __future__ import annotations

import math
from dataclasses import replace

from coordinator.core.params import DecayUnit, ProfileSettings
from coordinator.core.profiles import (
    PRIOR_ALPHA,
    PRIOR_BETA,
    CandidateProfile,
    LinkProfile,
    Moments,
)


def _join(a: Moments, b: Moments) -> Moments:
    return Moments(a.n + b.n, a.s1 + b.s1, a.s2 + b.s2)


def merge_weight(
    settings: ProfileSettings,
    base_last_s: float | None,
    delta: int | float,
    delta_last_s: float | None,
) -> float:
    """How much the base's counts decay while the delta's observations were folded."""
    if math.isinf(settings.half_life) or base_last_s is None:
        return 1.0
    if settings.decay_unit is DecayUnit.OBSERVATIONS:
        return float(0.5 ** (float(delta) / settings.half_life))
    elapsed = 0.0 if delta_last_s is None else max(0.0, delta_last_s - base_last_s)
    return float(0.5 ** (elapsed / settings.half_life))


def merge_candidate(
    base: CandidateProfile | None, delta: CandidateProfile | None, settings: ProfileSettings
) -> CandidateProfile | None:
    """``base`` followed by ``delta`` (a profile folded from empty over later observations):
    counts and moments add after decaying the base across the delta, Beta evidence adds
    above the prior, the recent-latency windows concatenate (base first) and are trimmed.
    A delta may hold late judgements only (:func:`coordinator.core.profiles.apply_quality`,
    no observation): they add to the Beta evidence and the quality moments, nothing
    decays."""
    if delta is None:
        return base
    if base is None:
        return delta
    w = merge_weight(settings, base.last_seen_s, delta.observations, delta.last_seen_s)
    recent = (*base.recent_latency_s, *delta.recent_latency_s)[-settings.latency_window :]
    return replace(
        base,
        alpha=PRIOR_ALPHA + (base.alpha - PRIOR_ALPHA) * w + (delta.alpha - PRIOR_ALPHA),
        beta=PRIOR_BETA + (base.beta - PRIOR_BETA) * w + (delta.beta - PRIOR_BETA),
        calls=base.calls * w + delta.calls,
        delivered=base.delivered * w + delta.delivered,
        successes=base.successes * w + delta.successes,
        internal_failures=base.internal_failures * w + delta.internal_failures,
        network_failures=base.network_failures * w + delta.network_failures,
        deadline_failures=base.deadline_failures * w + delta.deadline_failures,
        quality=_join(base.quality.scaled(w), delta.quality),
        latency=_join(base.latency.scaled(w), delta.latency),
        tokens_in=_join(base.tokens_in.scaled(w), delta.tokens_in),
        tokens_out=_join(base.tokens_out.scaled(w), delta.tokens_out),
        recent_latency_s=recent,
        observations=base.observations + delta.observations,
        last_seen_s=base.last_seen_s if delta.last_seen_s is None else delta.last_seen_s,
    )


def merge_link(
    base: LinkProfile | None, delta: LinkProfile | None, settings: ProfileSettings
) -> LinkProfile | None:
    """:func:`merge_candidate` for link profiles; the recent-bandwidth windows concatenate
    (base first) and are trimmed to ``bandwidth_window``."""
    if delta is None or delta.observations == 0:
        return base
    if base is None:
        return delta
    w = merge_weight(settings, base.last_seen_s, delta.observations, delta.last_seen_s)
    recent = (*base.recent_bandwidth_Bps, *delta.recent_bandwidth_Bps)
    return replace(
        base,
        transmissions=base.transmissions * w + delta.transmissions,
        losses=base.losses * w + delta.losses,
        bandwidth=_join(base.bandwidth.scaled(w), delta.bandwidth),
        rtt=_join(base.rtt.scaled(w), delta.rtt),
        recent_bandwidth_Bps=recent[-settings.bandwidth_window :],
        observations=base.observations + delta.observations,
        last_seen_s=delta.last_seen_s,
    )
