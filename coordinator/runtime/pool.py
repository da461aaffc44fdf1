"""Load the pool config, and resolve per-call settings against per-role defaults."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import ValidationError

from coordinator.config import HacoSettings
from coordinator.core.cofailure import Member
from coordinator.core.evidence import PoolMember, domain_members
from coordinator.core.params import PolicyParams
from coordinator.errors import (
    ConfigError,
    HacoError,
    UnknownRoleError,
    UnknownZoneError,
    describe_validation_error,
)
from schemas.enums import LaunchMode, WinnerMode
from schemas.models import Candidate, RoleInvocation
from schemas.pool import PoolConfig, SimSection
from schemas.scenario import Scenario
from sim.scenario import BUILTIN, load_builtin, load_scenario, read_toml


def check_zone(zone: str, zones: frozenset[str]) -> str:
    """A misspelled zone would create a queue nobody consumes: refused at every door."""
    if zone not in zones:
        raise UnknownZoneError(f"unknown zone {zone!r}; the pool's zones are {sorted(zones)}")
    return zone


def load_pool(path: Path) -> PoolConfig:
    raw = read_toml(path, "pool config", ConfigError)
    sim = raw.get("sim")
    if isinstance(sim, dict) and isinstance(sim.get("scenario"), str):
        scen = sim["scenario"]
        if scen not in BUILTIN and not Path(scen).is_absolute():
            sim["scenario"] = str((path.parent / scen).resolve())
    try:
        return with_sim_candidates(PoolConfig.model_validate(raw))
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, str(path))) from exc


def sim_scenario(sim: SimSection) -> Scenario:
    if sim.scenario in BUILTIN:
        return load_builtin(sim.scenario)
    return load_scenario(sim.scenario)


def with_sim_candidates(pool: PoolConfig) -> PoolConfig:
    """A pool with [sim] and no candidates takes the scenario's whole pool."""
    if pool.sim is None or pool.candidates:
        _check_sim_ids(pool)
        return pool
    scen = sim_scenario(pool.sim)
    unknown = sorted({c.zone for c in scen.candidates} - set(pool.zones))
    if unknown:
        raise ConfigError(f"scenario {scen.name!r} uses zones {unknown} missing from zones")
    return pool.model_copy(update={"candidates": list(scen.candidates)})


def _check_sim_ids(pool: PoolConfig) -> None:
    if pool.sim is None:
        return
    ids = {c.id for c in sim_scenario(pool.sim).candidates}
    for c in pool.candidates:
        ref = str(c.backend.settings.get("candidate", c.id))
        if c.backend.kind == "sim" and ref not in ids:
            raise ConfigError(f"sim candidate {c.id!r} refers to {ref!r}, not in the scenario")


def default_pool() -> PoolConfig:
    """The paper's simulated pool: three zones, 4 roles × 6 candidates, caller in local."""
    scen = load_builtin("overall")
    return with_sim_candidates(
        PoolConfig(
            caller_zone=scen.caller_zone, zones=scen.zones, sim=SimSection(scenario="overall")
        )
    )


def pool_from_settings(settings: HacoSettings) -> PoolConfig:
    return load_pool(settings.pool_file) if settings.pool_file else default_pool()


# Distinct per-call overrides whose effective settings a pool keeps (call_settings).
CALL_SETTINGS_MEMO = 1024


@dataclass(frozen=True, slots=True)
class CallSettings:
    """An invocation's effective settings after per-call > per-role > pool > runtime."""

    params: PolicyParams
    launch_mode: LaunchMode
    winner_mode: WinnerMode
    deadline_s: float


class Pool:
    """Indexed view of a pool config for the coordinator."""

    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        self.zones = frozenset(config.zones)
        self.by_role: dict[str, list[Candidate]] = {}
        for c in config.candidates:
            self.by_role.setdefault(c.role, []).append(c)
        # Each candidate as its member tasks carry it, built once (coordinator._prepare).
        self._sent = {c.id: with_sim(c, config.sim) for c in config.candidates}
        # call_settings by the invocation's overrides, with the settings it was made for.
        self._calls: dict[tuple[object, ...], tuple[HacoSettings, PolicyParams, CallSettings]] = {}

    def as_sent(self, cand: Candidate) -> Candidate:
        """``cand`` with the pool's [sim] section when simulated (:func:`with_sim`)."""
        sent = self._sent.get(cand.id)
        return (
            sent if sent is not None and sent.role == cand.role else with_sim(cand, self.config.sim)
        )

    def candidates(self, role: str) -> list[Candidate]:
        try:
            return self.by_role[role]
        except KeyError:
            raise UnknownRoleError(
                f"unknown role {role!r}; the pool serves {sorted(self.by_role)}"
            ) from None

    def check_zone(self, zone: str) -> str:
        return check_zone(zone, self.zones)

    def call_settings(
        self, inv: RoleInvocation, settings: HacoSettings, base: PolicyParams
    ) -> CallSettings:
        """``inv``'s effective settings; worked out once per distinct set of per-call
        overrides (a call's are few, and the same from call to call)."""
        key = (inv.role, inv.tau, inv.deadline_s, inv.launch_mode, inv.winner_mode,
               getattr(inv, "use_rtt", None))  # fmt: skip
        hit = self._calls.get(key)
        if hit is not None and hit[0] is settings and hit[1] is base:
            return hit[2]
        call = self._call_settings(inv, settings, base)
        if len(self._calls) >= CALL_SETTINGS_MEMO:
            self._calls.clear()  # callers that vary their overrides without end
        self._calls[key] = (settings, base, call)
        return call

    def _call_settings(
        self, inv: RoleInvocation, settings: HacoSettings, base: PolicyParams
    ) -> CallSettings:
        role = self.config.roles.get(inv.role)
        pool = self.config.defaults

        def pick(field: str) -> object:
            for source in (inv, role, pool):
                value = getattr(source, field, None) if source is not None else None
                if value is not None:
                    return value
            return None

        updates = {f: v for f in ("tau", "use_rtt") if (v := pick(f)) is not None}
        params = base.model_copy(update=updates) if updates else base
        launch = pick("launch_mode")
        winner = pick("winner_mode")
        deadline = pick("deadline_s")
        return CallSettings(
            params=params,
            launch_mode=launch if isinstance(launch, LaunchMode) else settings.launch_mode,
            winner_mode=winner if isinstance(winner, WinnerMode) else settings.winner_mode,
            deadline_s=deadline if isinstance(deadline, float) else settings.default_deadline_s,
        )


def endpoint_host(candidate: Candidate) -> str:
    """The host serving a candidate (``base_url`` / ``endpoint`` of its backend), a
    failure domain shared by every candidate behind it; "" when it has none (simulated)."""
    url = candidate.backend.settings.get("base_url") or candidate.backend.settings.get("endpoint")
    return (urlsplit(str(url)).hostname or "") if url else ""


def policy_members(cands: Sequence[Candidate]) -> list[PoolMember]:
    """A role's candidates as the policy sees them (their failure domains named)."""
    return [PoolMember(c.id, c.zone, c.model, endpoint_host(c)) for c in cands]


def domain_pools(pool: Pool) -> list[list[Member]]:
    """Each role's whole pool as the failure domains name it, in the order a coordinator
    plans it: the pools whose domains the recompute publishes (coordinator.core.domains)."""
    return [domain_members(policy_members(cands)) for cands in pool.by_role.values()]


def configured_domain_pools(
    settings: HacoSettings, warn: Callable[[str], None]
) -> list[list[Member]]:
    """:func:`domain_pools` of the pool config ``settings`` names (a recompute reads it
    each time, as a coordinator reads its own at start). One that does not load publishes
    no domains, said through ``warn`` with the file and the error: the coordinators then
    work theirs out from the evidence."""
    try:
        return domain_pools(Pool(pool_from_settings(settings)))
    except HacoError as exc:
        warn(f"failure domains not published: {exc}")
        return []


def with_sim(cand: Candidate, sim: SimSection | None) -> Candidate:
    """A simulated candidate as its member task carries it: with the pool's ``[sim]``
    section in its backend settings (the worker builds its simulated world from it)."""
    if cand.backend.kind != "sim" or sim is None or "sim" in cand.backend.settings:
        return cand
    settings = {**cand.backend.settings, "sim": sim.model_dump(mode="json")}
    return cand.model_copy(
        update={"backend": cand.backend.model_copy(update={"settings": settings})}
    )
