"""A DATAWISE-style controller (HACO App. C.1, spec §10) that emits role invocations.

States: INITIATE_PLAN → APPEND_CODE ⇄ (DEBUG → FILTER → APPEND_CODE) → UPDATE_PLAN → …
→ TERMINATE. The planner emits the task's steps and, after each coding stage, decides
ITERATE_ON_LAST_STEP, ADVANCE_TO_NEXT_STEP or FULFILL_INSTRUCTION. A generated cell runs
with probability ``quality ** code_difficulty``; a failed run goes to the debugger, whose
output the filter cleans before the coder tries again.

The controller is a generator: it yields :class:`Invocation` and is sent the
:class:`StepResult` of each. Step failures have consequences: an all-failed invocation
is retried ``max_invocation_retries`` times, then the task fails; a step whose code
never runs is iterated, then the task ends unfulfilled.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from schemas.scenario import WorkloadSpec


class State(StrEnum):
    INITIATE_PLAN = "INITIATE_PLAN"
    APPEND_CODE = "APPEND_CODE"
    DEBUG = "DEBUG"
    FILTER = "FILTER"
    UPDATE_PLAN = "UPDATE_PLAN"
    TERMINATE = "TERMINATE"


class PlanSignal(StrEnum):
    ITERATE_ON_LAST_STEP = "ITERATE_ON_LAST_STEP"
    ADVANCE_TO_NEXT_STEP = "ADVANCE_TO_NEXT_STEP"
    FULFILL_INSTRUCTION = "FULFILL_INSTRUCTION"


ROLE_OF = {
    State.INITIATE_PLAN: "planner",
    State.UPDATE_PLAN: "planner",
    State.APPEND_CODE: "coder",
    State.DEBUG: "debugger",
    State.FILTER: "filter",
}


@dataclass(frozen=True, slots=True)
class Invocation:
    role: str
    state: State
    request_bytes: int


@dataclass(frozen=True, slots=True)
class StepResult:
    ok: bool  # a winner returned; False = an all-failed step
    quality: float = 0.0  # true quality of the winning output
    tokens_out: int = 0


@dataclass
class TaskOutcome:
    completed: bool = False
    invocations: int = 0
    all_failed: int = 0
    aborted: bool = False  # ended because an invocation failed on every retry
    qualities: list[float] = field(default_factory=list)
    signals: list[PlanSignal] = field(default_factory=list)

    @property
    def score(self) -> float:
        """100 × mean true quality of the winning outputs; 0 for an unfinished task."""
        if not self.completed or not self.qualities:
            return 0.0
        return 100.0 * sum(self.qualities) / len(self.qualities)

    @property
    def strict_success(self) -> bool:
        return self.completed and self.all_failed == 0


class _Aborted(Exception):
    """An invocation failed on every retry: the task cannot go on."""


Controller = Generator[Invocation, StepResult, TaskOutcome]


@dataclass
class _Task:
    spec: WorkloadSpec
    bytes_per_token: float
    out: TaskOutcome = field(default_factory=TaskOutcome)
    context_bytes: int = 0

    def invoke(self, state: State) -> Generator[Invocation, StepResult, StepResult]:
        request = min(self.spec.prompt_bytes + self.context_bytes, self.spec.context_bytes_cap)
        for _ in range(1 + self.spec.max_invocation_retries):
            self.out.invocations += 1
            res = yield Invocation(ROLE_OF[state], state, request)
            if res.ok:
                self.context_bytes += round(res.tokens_out * self.bytes_per_token)
                self.out.qualities.append(res.quality)
                return res
            self.out.all_failed += 1
        raise _Aborted

    def code_stage(self, rng: np.random.Generator) -> Generator[Invocation, StepResult, bool]:
        """APPEND_CODE, then DEBUG → FILTER → APPEND_CODE until the cell runs."""
        d = self.spec.code_difficulty
        code = yield from self.invoke(State.APPEND_CODE)
        if rng.random() < code.quality**d:
            return True
        for _ in range(self.spec.max_debug_rounds):
            debug = yield from self.invoke(State.DEBUG)
            yield from self.invoke(State.FILTER)
            code = yield from self.invoke(State.APPEND_CODE)
            if rng.random() < (0.5 * (code.quality + debug.quality)) ** d:
                return True
        return False

    def run(self, rng: np.random.Generator) -> Controller:
        steps = int(rng.integers(self.spec.steps_min, self.spec.steps_max + 1))
        try:
            yield from self.invoke(State.INITIATE_PLAN)
            for step in range(steps):
                ran = False
                for _ in range(self.spec.max_step_iterations):
                    ran = yield from self.code_stage(rng)
                    yield from self.invoke(State.UPDATE_PLAN)
                    if ran:
                        break
                    self.out.signals.append(PlanSignal.ITERATE_ON_LAST_STEP)
                if not ran:
                    return self.out
                last = step == steps - 1
                self.out.signals.append(
                    PlanSignal.FULFILL_INSTRUCTION if last else PlanSignal.ADVANCE_TO_NEXT_STEP
                )
            self.out.completed = True
        except _Aborted:
            self.out.aborted = True
        return self.out


def datawise_task(
    spec: WorkloadSpec, rng: np.random.Generator, bytes_per_token: float = 4.0
) -> Controller:
    """A new task's controller; drive it with ``send`` until it returns its outcome."""
    return _Task(spec, bytes_per_token).run(rng)
