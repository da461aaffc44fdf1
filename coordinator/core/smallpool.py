"""The allocation rule's answer for a small pool, in plain floats: the runtime's plan.

:func:`coordinator.core.policy.allocate` works on numpy arrays and returns every term it
computed (:class:`~coordinator.core.policy.Allocation`: the simulator and the reports read
them). A runtime plan needs five things of it, once per call: the members, P_succ, the
stop reason and the members' U⁺ and R⁻. On a pool of a few candidates numpy's fixed cost
per operation (about a microsecond, and several on a call that follows a Redis wait, when
the caches are cold) is nearly all of the rule's time, and its code crowds the caller's
caches for the steps after it. :func:`in_floats` does allocate's arithmetic on floats, in
the same order, so its answer is allocate's to the bit (tests/test_smallpool.py compares
them on random pools). Two steps stay numpy's own: the fixed terms (memoized per
statistics, :class:`~coordinator.core.policy.FixedMemo`) and log1p, whose numpy loop is
not libm's and can differ from :func:`math.log1p` in the last bit.

Pure: no I/O, no randomness, like the rule itself.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from coordinator.core.cofailure import Dependence
from coordinator.core.params import PolicyParams
from coordinator.core.percentiles import median
from coordinator.core.policy import CandidateArrays
from schemas.enums import StopReason

# Largest pool decided in floats. The float loops grow with the pool and numpy's cost
# hardly does: in a warm loop (`python -m bench.runtime planning --sizes 6,16,24,48`)
# the floats took 7, 10, 20 and 19 µs against numpy's 17, 18, 29 and 18, so the two
# meet between 16 and 48 candidates. Larger pools, and any pool decided with failure
# domains (coordinator.core.joint), go through allocate.
SMALL_POOL = 16


@dataclass(frozen=True, slots=True)
class Choice:
    """What a plan takes from the rule: the members in rank order, the conservative
    P_succ of the set, why it stopped, and each member's U⁺ and R⁻."""

    members: tuple[int, ...]
    p_success: float
    stop: StopReason
    u_plus: tuple[float, ...]
    r_minus: tuple[float, ...]


def in_floats_applies(n: int, params: PolicyParams, dependence: Dependence | None) -> bool:
    """Whether a pool of ``n`` candidates is decided in floats: up to :data:`SMALL_POOL`
    candidates, without failure domains (those are coordinator.core.joint's rule)."""
    return n <= SMALL_POOL and not (params.use_dependence and dependence)


def in_floats(stats: CandidateArrays, params: PolicyParams) -> Choice:
    """allocate's decision without failure domains, worked out in floats, the same floats
    (any pool size: a plan takes this path when :func:`in_floats_applies`; bench/rtplan.py
    times it at every size). Like allocate, the caller validates once at the boundary
    (policy.validate)."""
    n = len(stats)
    fixed = stats.fixed.get(stats, params)
    u_num: list[float] = fixed.u_num.tolist()
    r_minus: list[float] = fixed.r_minus.tolist()
    u_plus = _u_plus(stats, params, fixed.eff_bw.tolist(), u_num)
    # allocate: a stable argsort of -U⁺ (ties keep pool order); sorted's reverse keeps
    # the order of equal keys too.
    order = sorted(range(n), key=u_plus.__getitem__, reverse=True)
    p_cum, prod = [], 1.0
    for i in order:  # np.cumprod's running product, then 1 − it
        prod *= 1.0 - r_minus[i]
        p_cum.append(1.0 - prod)
    first = bisect.bisect_left(p_cum, params.tau)  # np.searchsorted(side="left")
    if first < n:
        size, stop = first + 1, StopReason.TARGET_REACHED
    else:
        size, stop = n, StopReason.POOL_EXHAUSTED
    members = order[:size]
    return Choice(
        tuple(members), p_cum[size - 1], stop, tuple(u_plus[i] for i in members),
        tuple(r_minus[i] for i in members),
    )  # fmt: skip


def _u_plus(
    stats: CandidateArrays, params: PolicyParams, eff_bw: list[float], u_num: list[float]
) -> list[float]:
    """U⁺ = u_num / D per candidate, as policy._terms works it out."""
    if not params.use_env:
        return u_num  # D = 1 (the w/o Env ablation): U⁺ is its numerator
    t_proc: list[float] = stats.t_proc_s.tolist()
    size: list[float] = stats.bytes.tolist()
    T = [t + b / bw for t, b, bw in zip(t_proc, size, eff_bw, strict=True)]
    if params.use_rtt and stats.rtt_s is not None:
        T = [t + r for t, r in zip(T, stats.rtt_s.tolist(), strict=True)]
    t0 = median(T)  # a list's: statistics.median, the same float as the array's
    if t0 > 0:
        C: list[float] = np.log1p([t / t0 for t in T]).tolist()
    else:
        C = [0.0] * len(T)
    return [u / (1.0 + params.eta * c) for u, c in zip(u_num, C, strict=True)]
