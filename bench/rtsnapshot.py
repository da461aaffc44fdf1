"""The plan right after a new snapshot, in bench/rtplan.py's pools: the first plan of a
coordinator to find the snapshot reads what the co-failure evidence says about its pool.

Two ways, measured in turns (each first in every other round) on the same pool and the
same evidence:

- *worked out*: the snapshot publishes the evidence alone, and the plan reads and decodes
  it and works out the pool's failure domains (what every coordinator did before the
  recompute published them);
- *published*: the snapshot also publishes the pool's domains (coordinator.core.domains),
  and the plan reads and decodes those alone.

Each timed plan comes right after a snapshot is adopted (not timed), by a coordinator that
looks for one on every plan (``cofailure_refresh_s`` ~0): the plan reads the role's view
(its profiles are the new snapshot's), takes its domains, builds its view and decides.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import numpy as np

from bench.rtlib import Services
from bench.rtplan import ONCE, ROLE, fill_profiles, plan_pool, zone_cofailure
from coordinator.config import HacoSettings
from coordinator.core import domains
from coordinator.core.evidence import link_id
from coordinator.core.percentiles import median
from coordinator.runtime.client import HacoClient
from coordinator.runtime.pool import domain_pools
from coordinator.state import epochs

# A refresh this short makes every plan look for a new snapshot (it must be > 0).
LOOK_EVERY_S = 1e-6


def after_snapshot(svc: Services, n: int, rng: np.random.Generator) -> dict[str, Any]:
    """Median µs of the plan right after a new snapshot, both ways (module docstring), over
    ONCE snapshots each after one to warm."""
    settings = HacoSettings(redis_url=svc.url, cofailure_refresh_s=LOOK_EVERY_S)
    client = HacoClient(settings, pool=plan_pool(n), redis_url=svc.url)
    try:
        fill_profiles(client, rng)  # an earlier size's snapshot dropped them
        coord = client.coordinator
        r, ttl_s = svc.app_redis, settings.profile_ttl_s  # the database the client plans on
        inv = client.invocation(ROLE, "plan a hedge set for this request")
        cands = coord.pool.candidates(ROLE)
        caller = coord.pool.config.caller_zone
        lids = sorted({link_id(caller, c.zone) for c in cands})
        profiles, links = coord.store.load_profiles([c.id for c in cands], lids)
        evidence = zone_cofailure(cands, rng)
        pools = domain_pools(coord.pool)
        published = domains.work_out(pools, evidence, coord.profile_settings)
        version = itertools.count(int(time.time()))
        ways = [("worked_out", None), ("published", published)]
        samples: dict[str, list[float]] = {way: [] for way, _ in ways}
        for k in range(ONCE + 1):
            for way, pub in ways if k % 2 == 0 else ways[::-1]:  # neither always first
                seal = epochs.seal(r, ttl_s)
                snap = epochs.Snapshot(next(version), seal, profiles, links,
                                       cofailure=evidence, domains=pub)  # fmt: skip
                if not epochs.publish(r, snap, ttl_s):
                    raise RuntimeError("a later snapshot is adopted: the bench's Redis is shared")
                t0 = time.perf_counter_ns()
                coord._plan(inv)
                samples[way].append((time.perf_counter_ns() - t0) / 1000.0)
    finally:
        client.close()
    return {
        **{f"{way}_us": median(s[1:]) for way, s in samples.items()},
        "published_bytes": len(domains.encode(published)),
        "pools": len(pools),
    }
