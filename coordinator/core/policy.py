"""The HACO allocation rule (spec §2-§3) as pure functions over arrays.

Nothing here touches Redis, Celery or Postgres, and nothing is random: given the same
candidate statistics and parameters the decision is the same, so any decision can be
replayed from stored traces.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from coordinator.core.cofailure import Dependence
from coordinator.core.joint import joint_model, select
from coordinator.core.params import PolicyParams
from coordinator.core.percentiles import median
from coordinator.errors import PolicyError
from schemas.enums import StopReason

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.intp]

_FIELDS = ("alpha", "beta", "f_int", "loss", "t_proc_s", "bytes", "bandwidth_Bps", "jitter_Bps")


@dataclass(frozen=True, slots=True)
class _Fixed:
    """The terms of one candidate pool's statistics that do not depend on the request's
    size (which enters only T, through ``bytes``): μ, σ, ρ, R⁻, the effective bandwidth
    and U⁺'s numerator min(1, μ + λσ)·ρ."""

    mu: FloatArray
    sigma: FloatArray
    rho: FloatArray
    eff_bw: FloatArray
    u_num: FloatArray
    r_minus: FloatArray


# What the fixed terms are computed from, compared by identity: the arrays are never
# written in place (build_arrays makes new ones), so the same objects hold the same values.
_FIXED_INPUTS = ("alpha", "beta", "f_int", "loss", "bandwidth_Bps", "jitter_Bps")


class FixedMemo:
    """The fixed terms (:class:`_Fixed`) of the last few parameter sets one pool's
    statistics were decided with. Each entry keeps the arrays it was worked out from and
    is used only for those very arrays, so a memo shared by two statistics objects (a
    view and the same view sized for a request) never hands one the other's terms."""

    SIZE = 4  # parameter sets: a process decides with the defaults and a few overrides

    __slots__ = ("_entries", "_lock")

    def __init__(self) -> None:
        self._entries: list[tuple[tuple[FloatArray, ...], PolicyParams, _Fixed]] = []
        self._lock = threading.Lock()

    def get(self, stats: CandidateArrays, params: PolicyParams) -> _Fixed:
        inputs = tuple(getattr(stats, name) for name in _FIXED_INPUTS)
        for arrays, p, fixed in self._entries:
            if (p is params or p == params) and all(
                a is b for a, b in zip(arrays, inputs, strict=True)
            ):
                return fixed
        fixed = _fixed_terms(stats, params)
        with self._lock:
            self._entries = [(inputs, params, fixed), *self._entries[: self.SIZE - 1]]
        return fixed


@dataclass(frozen=True, slots=True)
class CandidateArrays:
    """Per-candidate statistics, one array element per candidate of the pool.

    alpha, beta: Beta posterior of judged quality. f_int: internal failure rate.
    loss: loss rate of the link to the candidate. t_proc_s: mean processing latency.
    bytes: expected bytes to transmit. bandwidth_Bps / jitter_Bps: observed link
    bandwidth and its standard deviation (bytes/s); inf bandwidth = a free link.
    rtt_s: the link's mean round-trip time (real mode, spec §13), counted in T only with
    ``PolicyParams.use_rtt``; None = unknown (no term).

    The arrays are not written after construction: the rule's memo (``fixed``) knows
    them by identity. :meth:`from_columns` copies what it is given for that reason.
    """

    alpha: FloatArray
    beta: FloatArray
    f_int: FloatArray
    loss: FloatArray
    t_proc_s: FloatArray
    bytes: FloatArray
    bandwidth_Bps: FloatArray
    jitter_Bps: FloatArray
    rtt_s: FloatArray | None = None
    # The terms a request's size leaves unchanged, worked out once per parameter set
    # (allocate); a view sized for a request shares its base view's (evidence.for_request).
    fixed: FixedMemo = field(default_factory=FixedMemo, compare=False, repr=False)

    def __len__(self) -> int:
        return int(self.alpha.shape[0])

    @classmethod
    def from_columns(cls, **columns: object) -> CandidateArrays:
        """Build and validate from sequences; raises PolicyError naming the bad value."""
        arrays: dict[str, Any] = {}
        size = None
        for name in _FIELDS:
            if name not in columns:
                raise PolicyError(f"missing candidate statistic {name!r}")
            arr = np.array(columns[name], dtype=np.float64)  # a copy: see the class
            if arr.ndim != 1:
                raise PolicyError(f"{name} must be one-dimensional, got shape {arr.shape}")
            size = arr.shape[0] if size is None else size
            if arr.shape[0] != size:
                raise PolicyError(f"{name} has {arr.shape[0]} values, expected {size}")
            arrays[name] = arr
        rtt = columns.get("rtt_s")
        if rtt is not None:
            arr = np.array(rtt, dtype=np.float64)
            if arr.shape != (size,):
                raise PolicyError(f"rtt_s has shape {arr.shape}, expected ({size},)")
            arrays["rtt_s"] = arr
        result = cls(**arrays)
        validate(result)
        return result


def validate(stats: CandidateArrays) -> None:
    """Reject statistics the rule is not defined for, naming the first bad value."""
    if len(stats) == 0:
        raise PolicyError("the candidate pool is empty; expected at least one candidate")
    for name in _FIELDS:
        arr: FloatArray = getattr(stats, name)
        # Only bandwidth may be infinite (a link that costs no transfer time).
        finite = np.isfinite(arr) if name != "bandwidth_Bps" else ~np.isnan(arr)
        bad = np.flatnonzero(~finite | (arr < 0))
        if bad.size:
            raise PolicyError(
                f"{name}[{int(bad[0])}] = {float(arr[bad[0]])!r}; "
                "expected a finite non-negative number"
            )
    for name in ("alpha", "beta"):
        arr = getattr(stats, name)
        bad = np.flatnonzero(~np.isfinite(arr) | (arr <= 0))
        if bad.size:
            raise PolicyError(
                f"{name}[{int(bad[0])}] = {float(arr[bad[0]])!r}; expected > 0 and finite"
            )
    for name in ("f_int", "loss"):
        arr = getattr(stats, name)
        bad = np.flatnonzero(arr > 1)
        if bad.size:
            raise PolicyError(
                f"{name}[{int(bad[0])}] = {float(arr[bad[0]])!r}; expected a rate in [0, 1]"
            )
    _check_rtt(stats)


def _check_rtt(stats: CandidateArrays) -> None:
    rtt = stats.rtt_s
    if rtt is None:
        return
    if rtt.shape != stats.alpha.shape or not bool(np.all(np.isfinite(rtt) & (rtt >= 0))):
        raise PolicyError("rtt_s: expected one finite non-negative RTT (s) per candidate")


@dataclass(frozen=True, slots=True)
class Allocation:
    """The rule's full answer: the chosen prefix and every intermediate quantity.

    Arrays are indexed by candidate (pool order) except ``order`` and ``p_success_cum``,
    which follow the U⁺ ranking.
    """

    order: IntArray  # candidate indices by U⁺ descending (ties: pool order)
    size: int  # members = order[:size]
    p_success: float
    stop: StopReason
    p_success_cum: FloatArray  # conservative P_succ after each prefix of ``order``
    mu: FloatArray
    sigma: FloatArray
    rho: FloatArray
    T_s: FloatArray
    C: FloatArray
    D: FloatArray
    u_plus: FloatArray
    r_minus: FloatArray
    # The dependence-aware rule's terms (None / equal to p_success: the paper's rule).
    p_success_indep: float = 0.0  # the paper's 1 − Π(1 − R⁻) of the same members
    achievable: float = 0.0  # the whole pool's P_succ: what no set can exceed
    dependence: Dependence | None = None
    diversified: bool = False  # members are not the U⁺ prefix of their size

    @property
    def members(self) -> IntArray:
        return self.order[: self.size]


def allocate(
    stats: CandidateArrays, params: PolicyParams, dependence: Dependence | None = None
) -> Allocation:
    """Rank by U⁺ and take the shortest prefix whose conservative P_succ reaches τ.

    ``dependence``: the pool's failure domains (coordinator.core.cofailure); with
    ``params.use_dependence`` and a positive shock, P_succ counts shared failure causes
    (coordinator.core.joint.select), otherwise it is the paper's independent product.
    The caller validates once at the boundary (:func:`validate`); this hot path does not.
    """
    t = _terms(stats, params)
    # Stable sort on -U⁺ keeps pool order among ties, so decisions are reproducible.
    order = np.argsort(-t.u_plus, kind="stable")
    if params.use_dependence and dependence:
        return _dependent(t, order, dependence, params)
    p_cum: FloatArray = np.subtract(1.0, np.cumprod(1.0 - t.r_minus[order]), dtype=np.float64)
    # p_cum is non-decreasing, so the first index reaching τ is a binary search.
    first = int(np.searchsorted(p_cum, params.tau, side="left"))
    if first < p_cum.shape[0]:
        size = first + 1
        stop = StopReason.TARGET_REACHED
    else:
        size = int(order.shape[0])
        stop = StopReason.POOL_EXHAUSTED
    p = float(p_cum[size - 1])
    return Allocation(
        order, size, p, stop, p_cum, t.mu, t.sigma, t.rho, t.T, t.C, t.D, t.u_plus,
        t.r_minus, p_success_indep=p, achievable=float(p_cum[-1]),
    )  # fmt: skip


def _dependent(t: _Terms, order: IntArray, dep: Dependence, params: PolicyParams) -> Allocation:
    model = joint_model(dep, t.r_minus, params.max_enumerated_domains)
    sel = select(order, model, t.u_plus, params.tau, params)
    members = sel.order[: sel.size]
    p_indep = 1.0 - float(np.prod(1.0 - t.r_minus[members]))
    return Allocation(
        sel.order, sel.size, sel.p_success, sel.stop, sel.p_success_cum, t.mu, t.sigma,
        t.rho, t.T, t.C, t.D, t.u_plus, t.r_minus, p_success_indep=p_indep,
        achievable=sel.achievable, dependence=dep, diversified=sel.diversified,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Terms:
    mu: FloatArray
    sigma: FloatArray
    rho: FloatArray
    T: FloatArray
    C: FloatArray
    D: FloatArray
    u_plus: FloatArray
    r_minus: FloatArray


def _fixed_terms(stats: CandidateArrays, params: PolicyParams) -> _Fixed:
    a, b = stats.alpha, stats.beta
    s = a + b
    mu = a / s
    sigma = np.sqrt(a * b / (s * s * (s + 1.0)))
    if params.use_env:
        rho = (1.0 - stats.f_int) * (1.0 - stats.loss)
        eff_bw = np.maximum(params.eps_b, stats.bandwidth_Bps - params.kappa * stats.jitter_Bps)
    else:
        # w/o Env ablation (spec §7): ρ = 1 and D = 1, the environment is invisible.
        rho = np.ones_like(mu)
        eff_bw = np.full_like(mu, np.inf)
    u_num = np.minimum(1.0, mu + params.lam * sigma) * rho
    lower = mu - params.gamma * sigma if params.use_lcb else mu
    r_minus = np.minimum(params.r_cap, np.maximum(params.eps_r, lower) * rho)
    return _Fixed(mu, sigma, rho, eff_bw, u_num, r_minus)


def _terms(stats: CandidateArrays, params: PolicyParams) -> _Terms:
    """Every per-candidate term of spec §2-§3: μ, σ, ρ, T, C, D, U⁺ and R⁻; those a
    request's size leaves unchanged come from the statistics' memo."""
    f = stats.fixed.get(stats, params)
    if params.use_env:
        T = stats.t_proc_s + stats.bytes / f.eff_bw
        if params.use_rtt and stats.rtt_s is not None:
            T = T + stats.rtt_s  # real mode (spec §13): the path delay counts too
        t0 = median(T)
        C = np.log1p(T / t0) if t0 > 0 else np.zeros_like(T)
        D = 1.0 + params.eta * C
    else:
        T = stats.t_proc_s.copy()
        C = np.zeros_like(f.mu)
        D = np.ones_like(f.mu)
    return _Terms(f.mu, f.sigma, f.rho, T, C, D, f.u_num / D, f.r_minus)
