"""Co-failure evidence (issue 10): how often hedge members fail *together*.

A hedge group runs several members on the same request, so its traces hold joint
outcomes. Each observed member gets a failure score φ: 1 for a failed call (a timeout
included), ``1 − q`` for a success judged ``q`` (quality is the probability that the
output is a qualified answer, so ``1 − q`` is the chance it is not), 0 for a success not
judged yet. For every pair of members of one group we keep decayed sums

    n (groups), Σφ_a, Σφ_b, Σφ_aφ_b

per candidate pair. ``Σφ_aφ_b − Σφ_a Σφ_b / n`` is n times the pair's sample covariance
over the groups in which both ran: zero in expectation when they fail independently.

Estimation, a common-cause ("shock") model as in reliability engineering's beta-factor
models: a *failure domain* d (the request itself, a zone, a model, a zone × model site, a
provider endpoint shared across zones and models, a pair with rich evidence) is hit with
probability ``c_d`` per request and then fails every member in it; members otherwise
fail independently. For two members sharing
domains with combined shock ``c`` and marginal success S_a, S_b:

    P(both fail) − F_a F_b = S_a S_b · c / (1 − c)

so ``c / (1 − c)`` is the pooled ratio of covariance to ``S_a S_b``. Pairs sharing
nothing but the request estimate ``c_request``; pairs sharing a zone (not the model)
estimate the zone's shock on top of the request's, and so on. Two guards keep noise
from passing for dependence: the excess counts only beyond ``cofail_z`` standard errors
of what independent members would show, and a prior of ``cofail_prior`` pseudo-groups
with no excess shrinks every ratio towards independence when evidence is thin.
Negative dependence is never assumed (it is clipped to 0): with no evidence, or
evidence of independence, the stopping rule is exactly the paper's.

Pure: no I/O, no randomness; the simulator folds groups online and the trace store's
recompute folds the same groups from Postgres (coordinator.tracestore.cofailuresql).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import msgspec
import numpy as np

from coordinator.core.params import ProfileSettings
from coordinator.core.profile_merge import merge_weight
from coordinator.core.profiles import decay_weight
from coordinator.errors import InputError

PairKey = tuple[str, str]


def failure_score(success: bool, quality: float | None) -> float:
    """φ of one observed member: 1 failed, ``1 − q`` judged success, 0 unjudged success."""
    if not success:
        return 1.0
    if quality is None:
        return 0.0
    if not 0.0 <= quality <= 1.0:
        raise InputError(f"quality={quality!r}; expected a judged score in [0, 1]")
    return 1.0 - quality


class PairStats(NamedTuple):
    """Decayed joint-outcome sums of one candidate pair (a < b by id). A named tuple, not
    a dataclass: a snapshot's evidence is decoded into thousands of them (6 567 at 200
    candidates in bench/rtplan.py), and a frozen dataclass's ``__init__`` took 0.8 µs
    each against 0.15 µs for a tuple's (``python -m bench.evidence_codec``)."""

    n: float = 0.0
    s_a: float = 0.0
    s_b: float = 0.0
    s_ab: float = 0.0
    observations: int = 0
    last_seen_s: float | None = None

    @property
    def excess(self) -> float:
        """Σφ_aφ_b − Σφ_aΣφ_b/n: observed joint failure beyond independence."""
        return self.s_ab - self.s_a * self.s_b / self.n if self.n > 0 else 0.0

    @property
    def success_weight(self) -> float:
        """(n − Σφ_a)(n − Σφ_b)/n: the S_a·S_b scale the excess is measured against."""
        return (self.n - self.s_a) * (self.n - self.s_b) / self.n if self.n > 0 else 0.0


@dataclass(frozen=True, slots=True)
class CoFailure:
    """Co-failure evidence of every candidate pair seen together in a group."""

    pairs: Mapping[PairKey, PairStats] = field(default_factory=dict)  # by pair_key


def pair_key(a: str, b: str) -> PairKey:
    return (a, b) if a <= b else (b, a)


def fold_group(
    evidence: CoFailure,
    outcomes: Sequence[tuple[str, float]],
    at_s: float,
    settings: ProfileSettings,
) -> CoFailure:
    """Fold one group's observed members ``(candidate_id, φ)``; a group with fewer than
    two distinct candidates tells nothing about co-failure and is ignored."""
    return fold_groups(evidence, [(outcomes, at_s)], settings)


def _scores(outcomes: Sequence[tuple[str, float]]) -> dict[str, float]:
    by_id: dict[str, float] = {}
    for cid, phi in outcomes:
        if not 0.0 <= phi <= 1.0:
            raise InputError(f"failure score {phi!r} of {cid!r}; expected a number in [0, 1]")
        by_id[cid] = phi  # a candidate twice in one group (a retry) counts once
    return by_id


def fold_groups(
    evidence: CoFailure,
    groups: Iterable[tuple[Sequence[tuple[str, float]], float]],
    settings: ProfileSettings,
) -> CoFailure:
    """Fold many groups ``(outcomes, at_s)`` in order. Each pair's sums are updated in
    place while folding: a new PairStats per pair and group made most of the recompute's
    fold time (bench/recompute.py). Only the pairs the groups hold are unpacked; the
    others are handed on as they are (the simulator folds one group at a time, and
    copying every pair per group took 14% of a run)."""
    known = evidence.pairs
    sums: dict[PairKey, _Sums] = {}
    for outcomes, at_s in groups:
        by_id = _scores(outcomes)
        ids = sorted(by_id)
        for i, a in enumerate(ids):
            for b in ids[i + 1 :]:
                s = sums.get((a, b))
                if s is None:
                    p = known.get((a, b))
                    s = sums[(a, b)] = _Sums() if p is None else _Sums(
                        p.n, p.s_a, p.s_b, p.s_ab, p.observations, p.last_seen_s
                    )  # fmt: skip
                s.add(by_id[a], by_id[b], decay_weight(settings, s.last_seen_s, at_s), at_s)
    pairs = dict(known)
    pairs.update((k, PairStats(s.n, s.s_a, s.s_b, s.s_ab, s.observations, s.last_seen_s))
                 for k, s in sums.items())  # fmt: skip
    return CoFailure(pairs)


@dataclass(slots=True)
class _Sums:
    """A pair's PairStats while folding, updated in place."""

    n: float = 0.0
    s_a: float = 0.0
    s_b: float = 0.0
    s_ab: float = 0.0
    observations: int = 0
    last_seen_s: float | None = None

    def add(self, phi_a: float, phi_b: float, w: float, at_s: float) -> None:
        """One group's outcomes, after decaying the sums by ``w`` (1.0 without decay)."""
        self.n = self.n * w + 1.0
        self.s_a = self.s_a * w + phi_a
        self.s_b = self.s_b * w + phi_b
        self.s_ab = self.s_ab * w + phi_a * phi_b
        self.observations += 1
        self.last_seen_s = at_s


def encode(evidence: CoFailure) -> str:
    """JSON: a list of ``[a, b, n, Σφ_a, Σφ_b, Σφ_aφ_b, observations, last_seen_s]``."""
    rows = [(a, b, *p) for (a, b), p in sorted(evidence.pairs.items())]
    return msgspec.json.encode(rows).decode()


# The encoded form's rows, typed: msgspec checks each row as it decodes it, in C.
_ROWS = msgspec.json.Decoder(list[tuple[str, str, float, float, float, float, int, float | None]])


def decode(text: str | bytes) -> CoFailure:
    """The inverse of :func:`encode`; InputError naming what is wrong."""
    try:
        rows = _ROWS.decode(text)
    except msgspec.MsgspecError as exc:
        raise InputError(f"co-failure evidence is not the encoded form: {exc}") from exc
    new = tuple.__new__  # PairStats(...) without its __new__'s keyword handling
    pairs = {
        ((a, b) if a <= b else (b, a)): new(PairStats, (n, sa, sb, sab, obs, last))  # pair_key
        for a, b, n, sa, sb, sab, obs, last in rows
    }
    return CoFailure(pairs)


def merge(base: CoFailure, delta: CoFailure, settings: ProfileSettings) -> CoFailure:
    """``base`` followed by ``delta`` (folded from empty over later groups), pairwise as
    the candidate profiles merge (coordinator.core.profiles)."""
    pairs = dict(base.pairs)
    for key, d in delta.pairs.items():
        b = pairs.get(key)
        if b is None:
            pairs[key] = d
            continue
        w = merge_weight(settings, b.last_seen_s, d.observations, d.last_seen_s)
        pairs[key] = PairStats(
            b.n * w + d.n,
            b.s_a * w + d.s_a,
            b.s_b * w + d.s_b,
            b.s_ab * w + d.s_ab,
            b.observations + d.observations,
            d.last_seen_s if d.last_seen_s is not None else b.last_seen_s,
        )
    return CoFailure(pairs)


# -- from evidence to the domains of a pool ------------------------------------------


@dataclass(frozen=True, slots=True)
class Domain:
    """A failure domain of a pool: a name, its members (pool indices), its shock c."""

    name: str
    members: tuple[int, ...]
    shock: float


@dataclass(frozen=True, slots=True)
class Dependence:
    """The dependence terms of one pool, in pool order; the allocation rule's input."""

    domains: tuple[Domain, ...]
    # What the joint model derives from the domains alone, per pool size
    # (coordinator.core.joint.DomainTable): worked out once per snapshot, not per view.
    derived: dict[int, object] = field(default_factory=dict, compare=False, repr=False)

    def __bool__(self) -> bool:
        return any(d.shock > 0.0 for d in self.domains)

    def membership(self, n: int) -> np.ndarray:
        m = np.zeros((len(self.domains), n), dtype=bool)
        for k, d in enumerate(self.domains):
            m[k, list(d.members)] = True
        return m


@dataclass(frozen=True, slots=True)
class Member:
    candidate_id: str
    zone: str
    model: str
    endpoint: str = ""  # the serving host (provider endpoint); "" = unknown, no domain


@dataclass
class _Pool:
    excess: float = 0.0
    weight: float = 0.0
    # Variance of the pooled excess under independence. φ lies in [0, 1], so a score of
    # mean m varies by at most m(1 − m) (Bhatia–Davis); the product bounds the pair's.
    var: float = 0.0

    def add(self, p: PairStats) -> None:
        """PairStats.excess and .success_weight, with the sums unpacked once (a pool of
        200 candidates adds thousands of pairs)."""
        n, s_a, s_b, s_ab, _, _ = p
        if n > 0:
            self.excess += s_ab - s_a * s_b / n
            self.weight += (n - s_a) * (n - s_b) / n
            m_a, m_b = s_a / n, s_b / n
            self.var += n * m_a * (1.0 - m_a) * m_b * (1.0 - m_b)


def _odds(pool: _Pool | None, prior: float, z: float) -> float:
    """Shrunk c/(1 − c) of pooled pairs, from the excess less z standard errors: what
    noise alone makes of independent members counts for nothing. Never negative."""
    if pool is None:
        return 0.0
    return max(0.0, pool.excess - z * math.sqrt(pool.var)) / (pool.weight + prior)


def _shock(odds: float) -> float:
    return odds / (1.0 + odds)


def _given(combined: float, *known: float) -> float:
    """The extra shock on top of ``known`` ones that makes the combined shock: c with
    (1 − combined) = (1 − c)·Π(1 − known), clipped at 0."""
    rest = 1.0
    for k in known:
        rest *= 1.0 - k
    return max(0.0, 1.0 - (1.0 - combined) / rest) if rest > 0 else 0.0


def _pair_classes(pool: Sequence[Member]) -> list[tuple[str, str, str, str]]:
    """Each member's class names for the pairs it is in (site, zone, model, endpoint;
    "" for an unknown endpoint): named once per member, not once per pair."""
    return [
        (
            f"site:{m.zone}/{m.model}", f"zone:{m.zone}", f"model:{m.model}",
            f"endpoint:{m.endpoint}" if m.endpoint else "",
        )
        for m in pool
    ]  # fmt: skip


def _collect(
    pool: Sequence[Member], evidence: CoFailure, settings: ProfileSettings
) -> tuple[dict[str, _Pool], list[tuple[int, int, PairStats]]]:
    """The pool's observed pairs pooled by what they share (the site, else the zone,
    else the model, else the endpoint, else only the request), and the rich pairs.
    Pairs in pool order, so each class's sums add up in the same order every time."""
    classes: dict[str, _Pool] = {}
    rich: list[tuple[int, int, PairStats]] = []
    names = _pair_classes(pool)
    pairs, rich_n = evidence.pairs, settings.cofail_pair_min_groups
    for i, a in enumerate(pool):
        a_id, a_zone, a_model, a_endpoint = a.candidate_id, a.zone, a.model, a.endpoint
        site, zone, model, endpoint = names[i]
        for j in range(i + 1, len(pool)):
            b = pool[j]
            b_id = b.candidate_id
            p = pairs.get((a_id, b_id) if a_id <= b_id else (b_id, a_id))  # pair_key
            if p is None or p.n <= 0:
                continue
            if a_zone == b.zone:
                name = site if a_model == b.model else zone
            elif a_model == b.model:
                name = model
            elif a_endpoint and a_endpoint == b.endpoint:
                name = endpoint
            else:
                name = "request"
            pooled = classes.get(name)
            if pooled is None:
                pooled = classes[name] = _Pool()
            pooled.add(p)
            if p.n >= rich_n:
                rich.append((i, j, p))
    return classes, rich


def dependence(
    pool: Sequence[Member], evidence: CoFailure, settings: ProfileSettings
) -> Dependence | None:
    """The failure domains of ``pool`` and their shocks, from the co-failure evidence.
    None when no pair of the pool was ever seen together (the paper's rule applies)."""
    classes, rich = _collect(pool, evidence, settings)
    if not classes:
        return None
    prior, z_err = settings.cofail_prior, settings.cofail_z

    def shock(name: str, *known: float) -> float:
        return _given(_shock(_odds(classes.get(name), prior, z_err)), *known)

    c_req = shock("request")
    domains = [Domain("request", tuple(range(len(pool))), c_req)]
    zone_c = {z: shock(f"zone:{z}", c_req) for z in {m.zone for m in pool}}
    model_c = {m: shock(f"model:{m}", c_req) for m in {m.model for m in pool}}
    groups: dict[tuple[str, str], float] = {}
    for z, c in zone_c.items():
        groups[("zone", z)] = c
    for m, c in model_c.items():
        groups[("model", m)] = c
    for z, m in {(m.zone, m.model) for m in pool}:
        groups[("site", f"{z}/{m}")] = shock(f"site:{z}/{m}", c_req, zone_c[z], model_c[m])
    for e in {m.endpoint for m in pool if m.endpoint}:
        groups[("endpoint", e)] = shock(f"endpoint:{e}", c_req)
    held = _held(pool)
    for (kind, value), c in sorted(groups.items()):
        idx = held[(kind, value)]
        if c > 0.0 and len(idx) > 1:
            domains.append(Domain(f"{kind}:{value}", idx, c))
    domains.extend(_pair_domains(pool, rich, domains, prior, z_err))
    return Dependence(tuple(domains))


def _held(pool: Sequence[Member]) -> dict[tuple[str, str], tuple[int, ...]]:
    """Who is in each zone, model, site (zone/model) and known endpoint, in pool order:
    one pass over the pool rather than one per domain."""
    held: dict[tuple[str, str], list[int]] = {}
    for i, m in enumerate(pool):
        for key in (("zone", m.zone), ("model", m.model), ("site", f"{m.zone}/{m.model}")):
            held.setdefault(key, []).append(i)
        if m.endpoint:
            held.setdefault(("endpoint", m.endpoint), []).append(i)
    return {key: tuple(idx) for key, idx in held.items()}


def _pair_domains(
    pool: Sequence[Member],
    rich: Iterable[tuple[int, int, PairStats]],
    domains: Sequence[Domain],
    prior: float,
    z: float,
) -> list[Domain]:
    """A pair seen together often enough gets its own domain for the co-failure its
    shared domains do not explain."""
    out = []
    for i, j, p in rich:
        pooled = _Pool()
        pooled.add(p)
        shared = [d.shock for d in domains if i in d.members and j in d.members]
        c = _given(_shock(_odds(pooled, prior, z)), *shared)
        if c > 0.0:
            out.append(Domain(f"pair:{pool[i].candidate_id}|{pool[j].candidate_id}", (i, j), c))
    return out
