"""The joint failure probability of a hedge set under shared failure domains.

The paper's stopping rule takes members' failures as independent:
``P(all fail) = Π F_i`` with ``F_i = 1 − R⁻_i``. Here each member fails when a shock
hits one of its domains (coordinator.core.cofailure: domain d is hit with probability
c_d per request, independently of other domains) or, otherwise, on its own with a
*residual* probability chosen so that its marginal stays F_i:

    1 − F_i = (1 − r_i) · Π_{d ∋ i} (1 − c_d)

(r_i is clipped at 0 when the shocks alone exceed F_i; the member then fails more often
than F_i, which errs on the safe side). With every c_d = 0 this is Π F_i exactly.

For a set S: a domain holding one member of S acts as that member's own failure and
folds into its residual; a domain holding all of S multiplies out in closed form; the
rest are enumerated, 2^k shock patterns. Past ``max_domains`` the weakest domains are
merged into one whose shock hits all their members at once: failure events only grow,
so the merged figure never understates P(all fail).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from coordinator.core.cofailure import Dependence
from coordinator.core.params import PolicyParams
from schemas.enums import StopReason

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


# From this many shock patterns (2^8) the prefixes' products are taken member by member:
# numpy's cumprod costs ~15 ns an element, a row's multiply ~1 µs plus ~1 ns an element
# (at 512 patterns × 200 members 2.0 → 0.4 ms; at 128 patterns the two are even). The
# products are the same, in the same order, so every prefix's figure is the same to the
# bit.
_ROWWISE_PATTERNS = 256


class DomainTable:
    """What a joint model takes from a pool's failure domains alone, whatever the
    members' failure probabilities: the domains with a shock, who is in each, each
    member's chance that none of its domains is hit, and (:meth:`patterns`) every shock
    pattern. Kept on the :class:`Dependence` (:func:`domain_table`), so a view built
    after a profile changed reuses them: a new view's model works out only what R⁻
    changes (at 200 candidates and 9 domains 235 → 115 µs a model; at 6, 42 → 9 µs).
    The last models themselves are kept too (:meth:`model`): the plans on one view
    decide with the same R⁻, whatever their requests' sizes."""

    MODELS = 2  # R⁻ arrays: a view's, and another parameter set's or the last view's

    __slots__ = ("_models", "_patterns", "member", "shock", "survive")

    def __init__(self, dep: Dependence, n: int) -> None:
        shock = np.array([d.shock for d in dep.domains], dtype=np.float64)
        keep = shock > 0.0
        self.shock: FloatArray = shock[keep]
        self.member: BoolArray = dep.membership(n)[keep]
        self.survive: FloatArray = np.prod(
            np.where(self.member, 1.0 - self.shock[:, None], 1.0), axis=0
        )
        self._patterns: tuple[FloatArray, BoolArray] | None = None
        self._models: tuple[tuple[FloatArray, int, JointModel], ...] = ()

    def model(self, dep: Dependence, r_minus: FloatArray, max_domains: int) -> JointModel:
        """The joint model of failure probabilities 1 − ``r_minus`` under ``dep`` (this
        table's). R⁻ is matched by identity: policy's fixed terms hand the same array to
        every plan on a view, and the entry holds it, so the identity stays its own."""
        for r, cap, model in self._models:
            if r is r_minus and cap == max_domains:
                return model
        model = JointModel(1.0 - r_minus, dep, max_domains)
        # One assignment of a new tuple: a plan on another thread sees the old or the new.
        self._models = ((r_minus, max_domains, model), *self._models[: self.MODELS - 1])
        return model

    def patterns(self) -> tuple[FloatArray, BoolArray]:
        """Each of the 2^k shock patterns' weight, and whether it hits each member (one
        of the member's domains shocked). The caller keeps k small (``max_domains``)."""
        if self._patterns is None:
            k = self.shock.size
            shocked = ((np.arange(1 << k)[:, None] >> np.arange(k)) & 1).astype(bool)
            weight = np.where(shocked, self.shock, 1.0 - self.shock).prod(axis=1)
            self._patterns = (weight, _hits(shocked, self.member))
        return self._patterns


def joint_model(dep: Dependence, r_minus: FloatArray, max_domains: int) -> JointModel:
    """The pool's joint model under ``dep`` for R⁻ ``r_minus``, kept with ``dep``'s
    domain table: a snapshot's plans on one view build it once, not once per call."""
    return domain_table(dep, r_minus.shape[0]).model(dep, r_minus, max_domains)


def domain_table(dep: Dependence, n: int) -> DomainTable:
    """``dep``'s :class:`DomainTable` for a pool of ``n``, worked out on first use."""
    table = dep.derived.get(n)
    if not isinstance(table, DomainTable):
        table = DomainTable(dep, n)
        dep.derived[n] = table  # one dict store: a racing thread's equal table is dropped
    return table


class JointModel:
    """P(all members of S fail) for any subset S of one pool."""

    def __init__(self, fail: FloatArray, dep: Dependence, max_domains: int) -> None:
        self.fail = fail
        self._domains = domain_table(dep, fail.shape[0])
        self.shock, self.member = self._domains.shock, self._domains.member
        self.max_domains = max_domains
        survive = self._domains.survive
        with np.errstate(divide="ignore", invalid="ignore"):
            resid = np.where(survive > 0, 1.0 - (1.0 - fail) / survive, 1.0)
        self.residual: FloatArray = np.clip(resid, 0.0, 1.0)
        self._tab: tuple[FloatArray, FloatArray] | None = None  # _table, built on first use

    def p_all_fail(self, members: npt.NDArray[np.intp]) -> float:
        """P(all of ``members`` fail): from the product table when every domain can be
        enumerated (one product over the set's columns), else :meth:`p_all_fail_closed`."""
        tab = self._table()
        if tab is None or members.size == 0:
            return self._p_all_fail(members, self.residual)
        weight, f = tab
        return float(weight @ f[:, members].prod(axis=1))

    def p_all_fail_closed(self, members: npt.NDArray[np.intp]) -> float:
        """:meth:`p_all_fail` without the product table: domains holding one member or
        all of S in closed form, the rest enumerated (merged past ``max_domains``)."""
        return self._p_all_fail(members, self.residual)

    def _table(self) -> tuple[FloatArray, FloatArray] | None:
        """Every shock pattern's weight and each member's failure probability under it
        (1 when a domain of the member is shocked, its residual otherwise): P(all of S
        fail) = weight @ prod over S of the columns. Built once, only when every domain
        can be enumerated (2^k patterns, k ≤ max_domains); None otherwise."""
        k = self.shock.size
        if k == 0 or k > self.max_domains:
            return None
        if self._tab is None:
            weight, hit = self._domains.patterns()
            self._tab = (weight, np.where(hit, 1.0, self.residual))
        return self._tab

    def p_all_fail_prefixes(self, order: npt.NDArray[np.intp]) -> FloatArray:
        """P(all fail) of every prefix of ``order``: one product table instead of one
        enumeration per prefix (exact, as p_all_fail, when the domains fit the cap)."""
        tab = self._table()
        if tab is None:
            return np.array([self.p_all_fail(order[: i + 1]) for i in range(order.size)])
        weight, f = tab
        if weight.size < _ROWWISE_PATTERNS:
            return np.asarray(weight @ np.cumprod(f[:, order], axis=1), dtype=np.float64)
        # The same products, member by member over every pattern at once.
        prefix = f.T[order]
        for i in range(1, order.size):
            np.multiply(prefix[i - 1], prefix[i], out=prefix[i])
        return np.asarray(prefix @ weight, dtype=np.float64)

    def p_all_fail_with_each(self, chosen: npt.NDArray[np.intp]) -> FloatArray | None:
        """P(all of ``chosen`` and member j fail) for every member j at once; None when
        the domains do not fit the cap (ask p_all_fail one by one)."""
        tab = self._table()
        if tab is None:
            return None
        weight, f = tab
        base = weight * f[:, chosen].prod(axis=1)
        return np.asarray(base @ f, dtype=np.float64)

    def p_shock_only(self, members: npt.NDArray[np.intp]) -> float:
        """P(all of S fail) from shared causes alone (every residual 0): what no number
        of members escapes."""
        return self._p_all_fail(members, np.zeros_like(self.residual))

    def _p_all_fail(self, members: npt.NDArray[np.intp], residual: FloatArray) -> float:
        if members.size == 0:
            return 1.0
        m = self.member[:, members]
        counts = m.sum(axis=1)
        resid = residual[members].copy()
        single = counts == 1
        if single.any():  # a domain with one member of S is that member's own failure
            own = np.where(m[single], 1.0 - self.shock[single][:, None], 1.0).prod(axis=0)
            resid = 1.0 - (1.0 - resid) * own
        full = counts == members.size
        if members.size == 1:
            full = np.zeros_like(full)
        shared_all = float(np.prod(1.0 - self.shock[full & ~single]))
        partial = (counts >= 2) & ~full
        rest = _enumerate(self.shock[partial], m[partial], resid, self.max_domains)
        return 1.0 - shared_all + shared_all * rest


def _hits(patterns: BoolArray, member: BoolArray) -> BoolArray:
    """Whether each shock pattern hits each member (one of its domains shocked). The
    counts are small integers, exact in floats, and a float product is BLAS's: at 512
    patterns × 200 members 64 µs against an integer product's 670 µs."""
    return np.asarray(patterns.astype(np.float64) @ member.astype(np.float64) > 0.0)


def _enumerate(shock: FloatArray, member: BoolArray, resid: FloatArray, cap: int) -> float:
    if shock.size == 0:
        return float(np.prod(resid))
    if shock.size > cap:
        order = np.argsort(-shock, kind="stable")
        top, weak = order[: cap - 1], order[cap - 1 :]
        merged_c = 1.0 - float(np.prod(1.0 - shock[weak]))
        shock = np.append(shock[top], merged_c)
        member = np.vstack([member[top], member[weak].any(axis=0)])
    k = shock.shape[0]
    patterns = ((np.arange(1 << k)[:, None] >> np.arange(k)) & 1).astype(bool)
    weight = np.where(patterns, shock, 1.0 - shock).prod(axis=1)
    hit = _hits(patterns, member)
    alone = np.where(hit, 1.0, resid).prod(axis=1)
    return float(weight @ alone)


@dataclass(frozen=True, slots=True)
class Selection:
    order: npt.NDArray[np.intp]  # the chosen members first (by U⁺), then the rest by U⁺
    size: int
    p_success: float  # dependence-aware, of order[:size]
    p_success_cum: FloatArray  # dependence-aware, after each prefix of ``order``
    stop: StopReason
    achievable: float  # the whole pool's dependence-aware P_succ
    diversified: bool  # the set is not the U⁺ prefix of its size


def select(
    ranked: npt.NDArray[np.intp],
    model: JointModel,
    u_plus: FloatArray,
    tau: float,
    params: PolicyParams,
) -> Selection:
    """The dependence-aware stopping rule, on the pool's joint model (:func:`joint_model`:
    built once per view and snapshot, since it depends on R⁻ and the domains alone).

    - How many members: the shortest U⁺ prefix whose dependence-aware P_succ reaches τ.
      For a fixed prefix that figure only falls as co-failure grows, so more observed
      co-failure never lowers the number of members, and with no shock it is the
      paper's prefix.
    - Which members: as many, chosen greedily: the next one maximises U⁺ times how
      much of its success survives, given that the members chosen so far failed (1
      under independence, so the greedy order is then the U⁺ order). Within a
      correlated domain that factor falls, and a member of another domain moves up.
      The greedy set replaces the prefix when it is more reliable.
    - No set reaches τ: with shared causes alone capping P_succ below τ the stop is
      ``target_unreachable``, else (a bigger pool would do) ``pool_exhausted``; the
      whole pool is sent, or with ``unreachable_members = "saturate"`` the shortest
      prefix within ``unreachable_slack`` of the achievable probability.
    """
    n = ranked.shape[0]
    p_cum = 1.0 - model.p_all_fail_prefixes(ranked)
    reached = np.flatnonzero(p_cum >= tau)
    achievable = float(p_cum[-1])
    if reached.size:
        size = int(reached[0]) + 1
        stop = StopReason.TARGET_REACHED
    else:
        capped = 1.0 - model.p_shock_only(ranked) < tau
        stop = StopReason.TARGET_UNREACHABLE if capped else StopReason.POOL_EXHAUSTED
        size = n
        if params.unreachable_members == "saturate":
            size = int(np.flatnonzero(p_cum >= achievable - params.unreachable_slack)[0]) + 1
    chosen = _greedy(ranked, u_plus, model, size)
    diversified = 1.0 - model.p_all_fail(chosen) > p_cum[size - 1] + 1e-12
    if not diversified:
        return Selection(ranked, size, float(p_cum[size - 1]), p_cum, stop, achievable, False)
    taken = np.zeros(n, dtype=bool)
    taken[chosen] = True
    in_set = taken[ranked]  # the chosen members in U⁺ order, then the rest
    order = np.concatenate([ranked[in_set], ranked[~in_set]])
    cum = 1.0 - model.p_all_fail_prefixes(order)
    return Selection(order, size, float(cum[size - 1]), cum, stop, achievable, True)


def _greedy(
    ranked: npt.NDArray[np.intp], u_plus: FloatArray, model: JointModel, size: int
) -> npt.NDArray[np.intp]:
    """The greedy set of ``size`` members, in the order taken."""
    survive = 1.0 - model.fail  # each candidate's own P(success)
    chosen = ranked[:1]
    left = ranked[1:]
    p_fail = model.p_all_fail(chosen)
    while chosen.size < size and left.size:
        each = model.p_all_fail_with_each(chosen)
        if each is not None:
            p_with = each[left]
        else:
            p_with = np.array([model.p_all_fail(np.append(chosen, j)) for j in left])
        i = _first_best(u_plus[left] * _rescue(p_fail, p_with, survive[left]))
        if i < 0:  # no score above -1 (past the cap merged bounds can rise): U⁺'s next
            i = 0
        else:
            p_fail = float(p_with[i])
        chosen = np.append(chosen, left[i])
        left = np.delete(left, i)
    return chosen


def _rescue(p_fail: float, p_with: FloatArray, survive: FloatArray) -> FloatArray:
    """How much of each candidate's success (``survive``) survives the chosen members'
    failure: P(it succeeds | they all failed) over its own P(success); 0 where
    undefined (divided only where defined: no warning to silence)."""
    rescue = np.zeros_like(p_with)
    if p_fail > 0:
        np.divide(p_fail - p_with, p_fail * survive, out=rescue, where=survive > 0)
    return rescue


def _first_best(scores: FloatArray) -> int:
    """The index of the best score, in U⁺ order the first of scores equal within a
    relative 1e-9: ties in rounding keep the ranking's order, so decisions replay.
    -1 when no score is above -1 (each set's merged bound, past the cap, may be above
    the smaller set's: the set's P(all fail) is then kept)."""
    best, best_score = -1, -1.0
    for i, score in enumerate(scores.tolist()):
        if score > best_score * (1.0 + 1e-9) + 1e-15:
            best, best_score = i, score
    return best
