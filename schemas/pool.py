"""The pool config: zones, candidates per role, per-role defaults (TOML, `HACO_POOL_FILE`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from schemas.enums import LaunchMode, WinnerMode
from schemas.models import Candidate, Identifier, ZoneName


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RoleDefaults(_Strict):
    tau: Annotated[float, Field(gt=0.0, lt=1.0)] | None = None
    launch_mode: LaunchMode | None = None
    winner_mode: WinnerMode | None = None
    deadline_s: Annotated[float, Field(gt=0.0, allow_inf_nan=False)] | None = None
    # Count the link's mean RTT in the allocation rule's T (real mode, spec §13;
    # coordinator.core.params.PolicyParams.use_rtt). None: the runtime's params decide.
    use_rtt: bool | None = None


class SimSection(_Strict):
    """The simulated world behind ``backend.kind = "sim"`` candidates."""

    scenario: str = "overall"  # a built-in scenario name or a path to a scenario TOML
    time_scale: Annotated[float, Field(gt=0.0, le=100.0)] | None = None


DEFAULT_JUDGE_PROMPT = """You are a strict evaluator. Rate how well the RESPONSE answers the \
REQUEST: correctness, completeness and whether it follows the instructions.

REQUEST:
{request}

RESPONSE:
{output}

Reply with one final line in exactly this form: Score: <integer 0-10>/10"""


def import_callable(path: str) -> Callable[..., object]:
    """The function named by ``"pkg.module:function"``; ValueError naming the path."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"callable {path!r}: expected an import path 'pkg.module:function'")
    try:
        obj: object = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as exc:  # any import-time failure of user code, reported with its path
        raise ValueError(f"callable {path!r} cannot be imported: {exc!r}") from exc
    if not callable(obj):
        raise ValueError(f"callable {path!r} names a {type(obj).__name__}, not a function")
    return obj


class JudgeConfig(_Strict):
    """How member outputs without a backend-judged quality are scored (the judge queue).

    ``llm``: the evaluator candidate ``candidate`` (one of ``PoolConfig.evaluators``)
    answers ``prompt`` ({request} and {output} are filled in); ``callable``: the user's
    function ``callable`` ("pkg.module:function", returning a score in [0, 1]); ``sim``:
    a simulated judge with the scenario's ``judge_noise`` of evaluator model ``model``
    (default: the scenario's evaluator)."""

    scorer: Literal["llm", "sim", "callable"] = "llm"
    candidate: Identifier | None = None
    callable: str | None = None
    prompt: str = DEFAULT_JUDGE_PROMPT
    model: str | None = None

    @field_validator("prompt")
    @classmethod
    def _placeholders(cls, v: str) -> str:
        missing = [p for p in ("{request}", "{output}") if p not in v]
        if missing:
            raise ValueError(f"the judge prompt lacks the placeholder(s) {missing}")
        return v

    @model_validator(mode="after")
    def _complete(self) -> JudgeConfig:
        if self.scorer == "llm" and self.candidate is None:
            raise ValueError(
                "scorer='llm' needs candidate = the id of one of the pool's evaluators"
            )
        if self.scorer == "callable":
            if self.callable is None:
                raise ValueError("scorer='callable' needs callable = 'pkg.module:function'")
            import_callable(self.callable)  # checked at load: a typo fails here, named
        return self


class PoolConfig(_Strict):
    caller_zone: ZoneName
    zones: list[ZoneName] = Field(min_length=1)
    defaults: RoleDefaults = RoleDefaults()
    roles: dict[Identifier, RoleDefaults] = Field(default_factory=dict)
    sim: SimSection | None = None
    candidates: list[Candidate] = Field(default_factory=list)
    # Evaluator candidates serve the judge only, never a role's hedge set.
    evaluators: list[Candidate] = Field(default_factory=list)
    evaluator: JudgeConfig | None = None

    @model_validator(mode="after")
    def _consistent(self) -> PoolConfig:
        zones = set(self.zones)
        if len(zones) != len(self.zones):
            raise ValueError(f"duplicate zone in zones={self.zones}")
        if self.caller_zone not in zones:
            raise ValueError(f"caller_zone={self.caller_zone!r} is not one of zones={self.zones}")
        seen: set[str] = set()
        for c in [*self.candidates, *self.evaluators]:
            if c.id in seen:
                raise ValueError(f"duplicate candidate id {c.id!r}")
            seen.add(c.id)
            if c.zone not in zones:
                raise ValueError(
                    f"candidate {c.id!r} has unknown zone {c.zone!r}; zones={self.zones}"
                )
            if c.backend.kind == "sim" and self.sim is None:
                raise ValueError(f"candidate {c.id!r} uses a sim backend but [sim] is missing")
        roles = {c.role for c in self.candidates}
        for role in self.roles:
            if self.candidates and role not in roles:
                raise ValueError(f"[roles.{role}] names a role no candidate serves")
        self._check_evaluator()
        return self

    def _check_evaluator(self) -> None:
        ev = self.evaluator
        if ev is None:
            return
        ids = [c.id for c in self.evaluators]
        if ev.candidate is not None and ev.candidate not in ids:
            raise ValueError(f"evaluator.candidate={ev.candidate!r} is not in evaluators={ids}")
        if ev.scorer == "sim" and self.sim is None:
            raise ValueError("evaluator scorer='sim' needs the pool's sim section")
