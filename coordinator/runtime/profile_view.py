"""The effective profiles of a pool as rows: μ ± σ and ρ as the allocation rule sees them,
failure rates by kind, latency percentiles (`haco profiles`, GET /v1/profiles)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from coordinator.core.evidence import PoolMember, build_arrays
from coordinator.core.params import PolicyParams, ProfileSettings
from coordinator.core.policy import allocate
from coordinator.core.profiles import CandidateProfile, latency_percentile
from schemas.models import Candidate

if TYPE_CHECKING:
    from coordinator.state.epochs import ProfileView


def _when(at_s: float | None) -> str | None:
    return None if at_s is None else datetime.fromtimestamp(at_s, UTC).isoformat()


def _row(c: Candidate, p: CandidateProfile | None, version: int | None) -> dict[str, Any]:
    calls = p.calls if p is not None else 0.0

    def rate(n: float) -> float:
        return n / calls if calls > 0 else 0.0

    return {
        "candidate": c.id, "role": c.role, "zone": c.zone,
        "fail_internal": rate(p.internal_failures) if p else 0.0,
        "fail_network": rate(p.network_failures) if p else 0.0,
        "fail_deadline": rate(p.deadline_failures) if p else 0.0,
        "latency_p50_s": latency_percentile(p, 50) if p else None,
        "latency_p95_s": latency_percentile(p, 95) if p else None,
        "calls": calls, "last_seen": _when(p.last_seen_s if p else None),
        "snapshot_version": version,
    }  # fmt: skip


def profile_rows(
    cands: list[Candidate], caller_zone: str, view: ProfileView
) -> list[dict[str, Any]]:
    """One row per candidate: μ ± σ and ρ as the allocation rule sees them (spec §2)."""
    if not cands:
        return []
    members = [PoolMember(c.id, c.zone) for c in cands]
    stats = build_arrays(members, caller_zone, view.candidates, view.links, 0.0, ProfileSettings())
    alloc = allocate(stats, PolicyParams())
    rows = []
    for i, c in enumerate(cands):
        row = _row(c, view.candidates.get(c.id), view.version)
        row.update(mu=float(alloc.mu[i]), sigma=float(alloc.sigma[i]), rho=float(alloc.rho[i]))
        rows.append(row)
    return rows
