"""Typed settings for every parameter of the method, with the paper's defaults (spec §6)."""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.enums import WinnerMode

Finite = Annotated[float, Field(allow_inf_nan=False)]


class PolicyParams(BaseModel):
    """Hyperparameters of the dual-bound allocation rule (spec §2-§3, §6)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tau: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.9
    lam: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] = 1.1  # λ, exploration
    gamma: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] = 0.7  # γ, conservative margin
    kappa: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] = 2.0  # κ, jitter penalty
    eta: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] = 0.5  # η, latency discount
    eps_b: Annotated[float, Field(gt=0.0, allow_inf_nan=False)] = 1e-6  # ε_B, bandwidth floor
    eps_r: Annotated[float, Field(ge=0.0, le=1.0)] = 0.1  # ε_R, reliability floor
    r_cap: Annotated[float, Field(gt=0.0, le=1.0)] = 0.98  # ceiling on R⁻
    # The paper's ablations switch these off (spec §7); the full method keeps both on.
    use_env: bool = True
    use_lcb: bool = True
    # Real deployment (spec §13): T also counts the link's mean RTT, T = t_proc + RTT +
    # k / max(ε_B, b − κj). Off by default: Eq. T_i of the paper has no RTT term and the
    # simulated figures are computed without it (the simulator's links do record a path
    # delay, so switching this on would change them). A pool config turns it on with
    # ``use_rtt = true`` in [defaults] or [roles.<role>].
    use_rtt: bool = False
    winner_mode: WinnerMode = WinnerMode.RANKED
    # The dependence-aware stopping rule (coordinator.core.joint): with co-failure
    # evidence, P_succ counts shared failure causes; with none it is the paper's rule.
    use_dependence: bool = True
    # Shock patterns are enumerated over at most this many domains of one set (2^k
    # patterns); past it the weakest merge into one, which only overstates P(all fail).
    max_enumerated_domains: Annotated[int, Field(ge=1, le=16)] = 10
    # No set reaches τ: send the whole pool (the paper's behaviour when the pool falls
    # short; never fewer members as co-failure grows) or "saturate": the shortest prefix
    # within unreachable_slack of the achievable probability (cheaper; members added
    # past it buy almost nothing against a shared cause).
    unreachable_members: Literal["pool", "saturate"] = "pool"
    unreachable_slack: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.005


class DecayUnit(StrEnum):
    OBSERVATIONS = "observations"
    SECONDS = "seconds"


class ProfileSettings(BaseModel):
    """How experience profiles forget (spec §5). half_life = inf is the paper."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    half_life: Annotated[float, Field(gt=0.0)] = math.inf
    decay_unit: DecayUnit = DecayUnit.OBSERVATIONS
    # How many recent latencies a profile keeps for percentiles: enough for a stable
    # p95 (about 13 samples above it) while staying small enough to ship in a snapshot.
    latency_window: Annotated[int, Field(ge=1, le=100_000)] = 256
    # How many recent bandwidth observations a link profile keeps: the policy's bandwidth
    # and jitter are their median and robust spread (1.4826 × MAD), not the mean and std
    # of every observation ever made, so a link whose bandwidth steps (a faster route)
    # switches to the new value once half the window is new instead of reading as wildly
    # jittery (mean − κ·std < 0, the ε_B floor) for as long as the history dominates.
    # 64: a link sees a few legs per call, so the switch takes some tens of calls, and a
    # median/MAD of 64 values is cheap enough for every decision.
    bandwidth_window: Annotated[int, Field(ge=1, le=100_000)] = 64
    # Cold-start processing latency when no candidate of the pool has data (spec §2 choice).
    cold_t_proc_s: Annotated[float, Field(gt=0.0, allow_inf_nan=False)] = 1.0
    # Bytes per token, to turn expected output tokens into bytes to transmit.
    bytes_per_token: Annotated[float, Field(gt=0.0, allow_inf_nan=False)] = 4.0
    # Co-failure evidence (coordinator.core.cofailure): pseudo-groups of independence
    # every domain's estimate starts from, so that a few unlucky groups do not make a
    # domain look correlated; the paper's rule is the limit of no evidence.
    cofail_prior: Annotated[float, Field(gt=0.0, allow_inf_nan=False)] = 10.0
    # ... and co-failure counts only beyond this many standard errors of what independent
    # members show by chance. Measured (bench.calibration, 5 seeds, τ = 0.9): at 1 the
    # independent paper pool keeps the paper's rule and cost exactly, and hardness is
    # calibrated to 0.9 points; 2 under-reacts (2.1 points), 0 adds 6% tokens on the
    # independent pool for noise.
    cofail_z: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] = 1.0
    # A pair seen together in this many (decayed) groups gets a domain of its own for
    # the co-failure its shared zone/model/request do not explain.
    cofail_pair_min_groups: Annotated[float, Field(gt=0.0, allow_inf_nan=False)] = 50.0
