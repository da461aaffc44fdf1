"""Failure domains worked out by the recompute and published with its snapshot.

A plan decides with its pool's failure domains (:func:`coordinator.core.cofailure.
dependence`), and they change only with the co-failure evidence, that is with each
recompute's snapshot. Worked out in a coordinator, they cost the first plan to see a new
snapshot the evidence's decode and the domains: 8.2 and 5.5 ms at 200 candidates
(``python -m bench.runtime planning``), on one caller's path, and in the coordinator
service in its event loop. A thread does not take them off it: the GIL holds the plan
while the thread works (tried, ``docs/BENCHMARKS.md``).

So the recompute, another process, works out the domains of every pool it knows (the
roles of its pool config) and publishes them beside the evidence, each under
:func:`pool_key`: the members in pool order and the settings ``dependence`` reads. A
coordinator whose pool has the same key takes its domains from there, and reads neither
the evidence nor works anything out. A pool of another key (another pool config, other
settings, a role with cooling candidates left out) works its own out from the evidence,
as before; the published ones are the same values to the bit (JSON floats round-trip).

Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from coordinator.core.cofailure import CoFailure, Dependence, Domain, Member, dependence
from coordinator.core.params import ProfileSettings
from coordinator.errors import InputError

PoolKey = str
Published = Mapping[PoolKey, Dependence | None]  # None: the paper's rule (no pair seen)


def pool_key(pool: Sequence[Member], settings: ProfileSettings) -> PoolKey:
    """What :func:`dependence` reads besides the evidence, as a short digest: the
    members (id, zone, model, endpoint) in pool order, since domains name members by
    their place, and the three settings it uses."""
    rows = [(m.candidate_id, m.zone, m.model, m.endpoint) for m in pool]
    terms = (settings.cofail_prior, settings.cofail_z, settings.cofail_pair_min_groups)
    # 16 bytes: a collision among a deployment's few pools is out of reach.
    return hashlib.blake2b(msgspec.json.encode([terms, rows]), digest_size=16).hexdigest()


def work_out(
    pools: Iterable[Sequence[Member]], evidence: CoFailure, settings: ProfileSettings
) -> dict[PoolKey, Dependence | None]:
    """Each pool's domains under its key (the recompute's share)."""
    return {pool_key(p, settings): dependence(p, evidence, settings) for p in pools}


# The encoded form: {key: [[name, [member, ...], shock], ...] or null}.
_Rows = list[tuple[str, list[int], float]]
_DECODER = msgspec.json.Decoder(dict[str, _Rows | None])


def encode(published: Published) -> str:
    return msgspec.json.encode(
        {
            key: None if dep is None else [(d.name, d.members, d.shock) for d in dep.domains]
            for key, dep in sorted(published.items())
        }
    ).decode()


def decode(text: str | bytes) -> dict[PoolKey, Dependence | None]:
    """The inverse of :func:`encode`; InputError naming what is wrong."""
    try:
        raw = _DECODER.decode(text)
    except msgspec.MsgspecError as exc:
        raise InputError(f"published failure domains are not the encoded form: {exc}") from exc
    return {key: None if rows is None else _dependence(key, rows) for key, rows in raw.items()}


def _dependence(key: PoolKey, rows: _Rows) -> Dependence:
    domains = []
    for name, members, shock in rows:
        if not 0.0 <= shock <= 1.0:
            raise InputError(f"domain {name!r} of pool {key}: shock {shock!r}; expected [0, 1]")
        if any(i < 0 for i in members) or members != sorted(set(members)):
            raise InputError(
                f"domain {name!r} of pool {key}: members {members!r}; "
                "expected distinct pool places in increasing order"
            )
        domains.append(Domain(name, tuple(members), shock))
    return Dependence(tuple(domains))


def fits(dep: Dependence | None, size: int) -> bool:
    """Whether every domain of ``dep`` names places of a pool of ``size`` members."""
    return dep is None or all(d.members[-1] < size for d in dep.domains if d.members)
