"""The mutable state of a simulated world: links, candidates' failure rates and models,
the evaluator, and the timed changes of a scenario (degradations at a task index).

It also draws what the members of one role invocation share (:class:`RequestContext`):
which zone- or model-wide shocks hit the request, and how hard the request is. The
paper's settings have neither, and then nothing is drawn and every call is independent.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from schemas.models import Candidate, link_key
from schemas.scenario import CandidateChange, EvaluatorChange, LinkChange, Scenario
from sim.candidates import CallDraw, SimModel, simulate_call
from sim.network import LinkState


@dataclass(frozen=True, slots=True)
class RequestContext:
    """What every member call of one role invocation shares.

    ``solve_scale`` scales each successful output's true quality (the probability that
    it is a qualified answer) to clip(q · scale, 0, 1); ``failed_zones`` and
    ``failed_models`` are the scopes a shock takes down for this request: every
    candidate in one of them fails its call (``FailureKind.INTERNAL``). ``tier`` names
    the hardness tier drawn (its name, or its index in ``[[hardness]]``).
    """

    solve_scale: float = 1.0
    failed_zones: frozenset[str] = frozenset()
    failed_models: frozenset[str] = frozenset()
    tier: str | None = None

    def hits(self, zone: str, model: str) -> bool:
        return zone in self.failed_zones or model in self.failed_models


NEUTRAL = RequestContext()  # independent calls: what the paper's settings assume


class SimWorld:
    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.caller_zone = scenario.caller_zone
        self.deadline_s = scenario.workload.deadline_s
        self.models = {name: SimModel(name, spec) for name, spec in scenario.models.items()}
        self.links = {link.key: LinkState.from_link(link) for link in scenario.links}
        self.failure_rate: dict[str, float] = {c.id: c.failure_rate for c in scenario.candidates}
        self.model_of: dict[str, str] = {c.id: c.model for c in scenario.candidates}
        self.evaluator_model = scenario.evaluator.model
        self._applied: set[int] = set()
        self.task = 0  # the current task, set by apply_changes (shocks span tasks)
        tiers = scenario.hardness
        self._tier_cdf = list(accumulate(t.share for t in tiers))
        self._tier_names = [t.name or str(i) for i, t in enumerate(tiers)]

    def register(self, candidate: Candidate) -> None:
        """Add a candidate outside the scenario's pool (the fixed-zone baselines)."""
        self.failure_rate[candidate.id] = candidate.failure_rate
        self.model_of[candidate.id] = candidate.model

    def apply_changes(self, task: int) -> list[str]:
        """Switch on every change scheduled for ``task``; returns what changed."""
        self.task = task
        done: list[str] = []
        for i, ch in enumerate(self.scenario.changes):
            if ch.at_task != task or i in self._applied:
                continue
            self._applied.add(i)
            if isinstance(ch, CandidateChange):
                if ch.failure_rate is not None:
                    self.failure_rate[ch.candidate] = ch.failure_rate
                if ch.model is not None:
                    self.model_of[ch.candidate] = ch.model
                done.append(f"candidate {ch.candidate}")
            elif isinstance(ch, LinkChange):
                key = link_key(ch.a, ch.b)
                self.links[key] = self.links[key].changed(ch)
                done.append(f"link {ch.a}-{ch.b}")
            elif isinstance(ch, EvaluatorChange):
                self.evaluator_model = ch.model
                done.append(f"evaluator {ch.model}")
        return done

    def link_to(self, zone: str) -> LinkState:
        return self.links[link_key(self.caller_zone, zone)]

    def begin_request(self, rng: np.random.Generator) -> RequestContext:
        """The shared context of one role invocation, drawn from ``rng`` (a stream of
        its own, not the one the calls draw from). In a fixed order: one uniform per
        shock active at the current task (in file order), then one uniform for the
        hardness tier if the scenario has tiers. A scenario with neither draws nothing
        and gets the neutral context, so the paper's settings stay bit-identical."""
        sc = self.scenario
        if not sc.shocks and not sc.hardness:
            return NEUTRAL
        zones: set[str] = set()
        models: set[str] = set()
        for shock in sc.shocks:
            if shock.active(self.task) and rng.random() < shock.probability:
                (zones if shock.scope == "zone" else models).add(shock.target)
        scale, tier = 1.0, None
        if self._tier_cdf:
            # The last tier takes any rounding slack of the shares' sum.
            i = min(bisect.bisect_right(self._tier_cdf, rng.random()), len(self._tier_cdf) - 1)
            scale, tier = sc.hardness[i].solve_scale, self._tier_names[i]
        return RequestContext(scale, frozenset(zones), frozenset(models), tier)

    def call(
        self,
        candidate: Candidate,
        request_bytes: float,
        rng: np.random.Generator,
        ctx: RequestContext | None = None,
    ) -> CallDraw:
        """One member call; ``ctx`` (from :meth:`begin_request`) is shared by the whole
        hedge group. None, or the neutral context, is an independent call."""
        model = self.model_of[candidate.id]
        ctx = NEUTRAL if ctx is None else ctx
        return simulate_call(
            self.models[model],
            self.failure_rate[candidate.id],
            self.link_to(candidate.zone),
            request_bytes,
            self.scenario.network,
            rng,
            shocked=ctx.hits(candidate.zone, model),
            solve_scale=ctx.solve_scale,
        )

    def judge_noise(self) -> float:
        return self.scenario.models[self.evaluator_model].judge_noise

    def judge_latency_s(self) -> float:
        return self.scenario.models[self.evaluator_model].judge_latency_s

    def evaluator_tokens_per_output(self) -> int:
        return self.scenario.evaluator.tokens_per_output
