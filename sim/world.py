"""The mutable state of a simulated world: links, candidates' failure rates and models,
the evaluator, and the timed changes of a scenario (degradations at a task index)."""

from __future__ import annotations

import numpy as np

from schemas.models import Candidate, link_key
from schemas.scenario import CandidateChange, EvaluatorChange, LinkChange, Scenario
from sim.candidates import CallDraw, SimModel, simulate_call
from sim.network import LinkState


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

    def register(self, candidate: Candidate) -> None:
        """Add a candidate outside the scenario's pool (the fixed-zone baselines)."""
        self.failure_rate[candidate.id] = candidate.failure_rate
        self.model_of[candidate.id] = candidate.model

    def apply_changes(self, task: int) -> list[str]:
        """Switch on every change scheduled for ``task``; returns what changed."""
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

    def call(
        self, candidate: Candidate, request_bytes: float, rng: np.random.Generator
    ) -> CallDraw:
        return simulate_call(
            self.models[self.model_of[candidate.id]],
            self.failure_rate[candidate.id],
            self.link_to(candidate.zone),
            request_bytes,
            self.scenario.network,
            rng,
        )

    def judge_noise(self) -> float:
        return self.scenario.models[self.evaluator_model].judge_noise

    def judge_latency_s(self) -> float:
        return self.scenario.models[self.evaluator_model].judge_latency_s

    def evaluator_tokens_per_output(self) -> int:
        return self.scenario.evaluator.tokens_per_output
