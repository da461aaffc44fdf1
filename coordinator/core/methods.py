"""HACO and the paper's baselines and ablations (spec §7) behind one policy interface.

A method is a pure decision function: it reads a :class:`PoolView` (the pool and the
evidence about it) and an injected random generator, and returns a :class:`Decision`.
The runner (simulator or distributed runtime) carries the decision out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from coordinator.core.cofailure import Dependence
from coordinator.core.params import PolicyParams
from coordinator.core.policy import Allocation, CandidateArrays, FloatArray, allocate
from coordinator.core.smallpool import in_floats, in_floats_applies
from coordinator.errors import InputError
from schemas.enums import StopReason, WinnerMode


@dataclass(frozen=True, slots=True)
class PoolView:
    """What a method may look at: ids, zones, policy statistics and simple history."""

    ids: Sequence[str]
    zones: Sequence[str]
    stats: CandidateArrays
    calls: FloatArray  # calls made to each candidate
    success_rate: FloatArray  # successes / calls (0 when never called)
    mean_quality: FloatArray  # mean judged quality of successes (0 when none)
    dependence: Dependence | None = None  # failure domains from co-failure evidence


@dataclass(frozen=True, slots=True)
class Decision:
    members: tuple[int, ...]  # pool indices in rank order (rank 0 first)
    p_success: float
    stop: StopReason
    winner_mode: WinnerMode
    u_plus: tuple[float, ...] = ()  # per member, when the method computes it
    r_minus: tuple[float, ...] = ()
    allocation: Allocation | None = None


class Method(Protocol):
    @property
    def name(self) -> str: ...

    def decide(self, view: PoolView, rng: np.random.Generator) -> Decision: ...


def _from_allocation(alloc: Allocation, winner_mode: WinnerMode) -> Decision:
    members = alloc.members
    return Decision(
        members=tuple(int(i) for i in members),
        p_success=alloc.p_success,
        stop=alloc.stop,
        winner_mode=winner_mode,
        u_plus=tuple(float(alloc.u_plus[i]) for i in members),
        r_minus=tuple(float(alloc.r_minus[i]) for i in members),
        allocation=alloc,
    )


@dataclass(frozen=True)
class Haco:
    """The dual-bound rule; ablations are the same rule with a component switched off."""

    params: PolicyParams = field(default_factory=PolicyParams)
    name: str = "haco"

    def decide(self, view: PoolView, rng: np.random.Generator) -> Decision:
        alloc = allocate(view.stats, self.params, view.dependence)
        return _from_allocation(alloc, self.params.winner_mode)

    def choose(self, view: PoolView) -> Decision:
        """:meth:`decide`'s decision as a runtime plan takes it: for a small pool worked
        out in floats, without the Allocation (None: coordinator.core.smallpool)."""
        if not in_floats_applies(len(view.stats), self.params, view.dependence):
            alloc = allocate(view.stats, self.params, view.dependence)
            return _from_allocation(alloc, self.params.winner_mode)
        c = in_floats(view.stats, self.params)
        mode = self.params.winner_mode
        return Decision(c.members, c.p_success, c.stop, mode, c.u_plus, c.r_minus)


def _single(index: int) -> Decision:
    return Decision(
        members=(index,), p_success=0.0, stop=StopReason.SINGLE_ROUTE, winner_mode=WinnerMode.FIRST
    )


@dataclass(frozen=True)
class RandomOne:
    """One candidate, uniformly at random."""

    name: str = "random"

    def decide(self, view: PoolView, rng: np.random.Generator) -> Decision:
        return _single(int(rng.integers(len(view.ids))))


@dataclass(frozen=True)
class BestOne:
    """One candidate, the best by record: mean judged quality of successes × success rate.

    Cold start: every candidate is tried ``n_min`` times first (least-tried first, pool
    order among ties); then ε-greedy with exploration probability ``p_exp``.
    """

    n_min: int = 2
    p_exp: float = 0.1
    name: str = "bestone"

    def decide(self, view: PoolView, rng: np.random.Generator) -> Decision:
        under = np.flatnonzero(view.calls < self.n_min)
        if under.size:
            return _single(int(under[np.argmin(view.calls[under])]))
        if rng.random() < self.p_exp:
            return _single(int(rng.integers(len(view.ids))))
        score = view.mean_quality * view.success_rate
        return _single(int(np.argmax(score)))


@dataclass(frozen=True)
class BestOnePaper:
    """BestOne as the paper's results show it: after the same warm-up (every candidate
    tried ``n_min`` times), the route with the best mean judged quality so far is fixed
    for good, ε-greedy exploration aside. It keeps a route that was best beforehand
    however it degrades later, which is what makes the paper's BestOne collapse
    (+67 to +73 points of all-failed rate). :class:`BestOne`, whose record is quality ×
    success rate, is the adaptive variant.

    The fixed route is the one piece of state a method keeps (per pool, by its ids):
    a fresh instance per run, as the runner builds them.
    """

    n_min: int = 2
    p_exp: float = 0.1
    name: str = "bestone-paper"
    _fixed: dict[tuple[str, ...], int] = field(default_factory=dict, compare=False, repr=False)

    def decide(self, view: PoolView, rng: np.random.Generator) -> Decision:
        under = np.flatnonzero(view.calls < self.n_min)
        if under.size:
            return _single(int(under[np.argmin(view.calls[under])]))
        if rng.random() < self.p_exp:
            return _single(int(rng.integers(len(view.ids))))
        key = tuple(view.ids)
        if key not in self._fixed:
            self._fixed[key] = int(np.argmax(view.mean_quality))
        return _single(self._fixed[key])


@dataclass(frozen=True)
class MixtureOfAgents:
    """Best-of-N: the whole pool in parallel, the evaluator's highest score wins."""

    name: str = "moa"

    def decide(self, view: PoolView, rng: np.random.Generator) -> Decision:
        return Decision(
            members=tuple(range(len(view.ids))),
            p_success=0.0,
            stop=StopReason.FULL_POOL,
            winner_mode=WinnerMode.BEST,
        )


@dataclass(frozen=True)
class FirstCandidate:
    """A fixed route: the runner hands it a one-candidate pool per role (fixed-zone)."""

    name: str = "fixed"

    def decide(self, view: PoolView, rng: np.random.Generator) -> Decision:
        return _single(0)


# The full method and the paper's ablations (spec §7): what each switches off. The one
# list of their names; as methods of the simulator they are "haco" and "haco-<variant>".
HACO_VARIANTS: dict[str, dict[str, object]] = {
    "haco": {},
    # The paper's stopping rule, members taken as independent (issue 10's comparison).
    "indep": {"use_dependence": False},
    "wo_env": {"use_env": False},
    "wo_ucb": {"lam": 0.0},
    "wo_lcb": {"use_lcb": False},
}
HACO_METHODS = tuple(v if v == "haco" else f"haco-{v}" for v in HACO_VARIANTS)


def haco_variant(params: PolicyParams, variant: str) -> Haco:
    """The full method or one of the paper's ablations (spec §7)."""
    if variant not in HACO_VARIANTS:
        raise InputError(
            f"unknown HACO variant {variant!r}; expected one of {', '.join(HACO_VARIANTS)}"
        )
    update = HACO_VARIANTS[variant]
    return Haco(params.model_copy(update=update) if update else params, variant)


BASELINES: dict[str, Callable[[], Method]] = {
    "random": RandomOne,
    "bestone": BestOne,
    "bestone-paper": BestOnePaper,
    "moa": MixtureOfAgents,
}
