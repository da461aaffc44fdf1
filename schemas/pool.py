"""The pool config: zones, candidates per role, per-role defaults (TOML, `HACO_POOL_FILE`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.enums import LaunchMode, WinnerMode
from schemas.models import Candidate, Identifier, ZoneName


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RoleDefaults(_Strict):
    tau: Annotated[float, Field(gt=0.0, lt=1.0)] | None = None
    launch_mode: LaunchMode | None = None
    winner_mode: WinnerMode | None = None
    deadline_s: Annotated[float, Field(gt=0.0, allow_inf_nan=False)] | None = None


class SimSection(_Strict):
    """The simulated world behind ``backend.kind = "sim"`` candidates."""

    scenario: str = "overall"  # a built-in scenario name or a path to a scenario TOML
    time_scale: Annotated[float, Field(gt=0.0, le=100.0)] | None = None


class PoolConfig(_Strict):
    caller_zone: ZoneName
    zones: list[ZoneName] = Field(min_length=1)
    defaults: RoleDefaults = RoleDefaults()
    roles: dict[Identifier, RoleDefaults] = Field(default_factory=dict)
    sim: SimSection | None = None
    candidates: list[Candidate] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> PoolConfig:
        zones = set(self.zones)
        if len(zones) != len(self.zones):
            raise ValueError(f"duplicate zone in zones={self.zones}")
        if self.caller_zone not in zones:
            raise ValueError(f"caller_zone={self.caller_zone!r} is not one of zones={self.zones}")
        seen: set[str] = set()
        for c in self.candidates:
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
        return self
