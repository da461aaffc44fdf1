"""`haco bench decision`: how long the allocation rule takes to choose a hedge set.

Times :func:`coordinator.core.policy.allocate` on pools of the given sizes (random but
seeded statistics), and the full decision from profiles (building the arrays from
experience profiles, then allocating) for the same sizes. Calls are timed in batches so
the timer's own cost is spread; the figure is the median per-call time over batches.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from coordinator.core.evidence import PoolMember, build_arrays, link_id
from coordinator.core.params import PolicyParams, ProfileSettings
from coordinator.core.percentiles import lower, median
from coordinator.core.policy import CandidateArrays, allocate, validate
from coordinator.core.profiles import (
    CandidateObservation,
    CandidateProfile,
    LinkObservation,
    LinkProfile,
    update_candidate,
    update_link,
)

ZONES = ("local", "regional", "global")


def random_stats(n: int, rng: np.random.Generator) -> CandidateArrays:
    stats = CandidateArrays(
        alpha=rng.uniform(1.0, 40.0, n),
        beta=rng.uniform(1.0, 20.0, n),
        f_int=rng.uniform(0.0, 0.2, n),
        loss=rng.uniform(0.0, 0.03, n),
        t_proc_s=rng.uniform(0.5, 8.0, n),
        bytes=rng.uniform(2_000.0, 40_000.0, n),
        bandwidth_Bps=rng.uniform(4e4, 2e6, n),
        jitter_Bps=rng.uniform(0.0, 5e3, n),
    )
    validate(stats)
    return stats


def random_profiles(
    n: int, rng: np.random.Generator, settings: ProfileSettings
) -> tuple[list[PoolMember], dict[str, CandidateProfile], dict[str, LinkProfile]]:
    pool = [PoolMember(f"c{i}", ZONES[i % len(ZONES)]) for i in range(n)]
    cands: dict[str, CandidateProfile] = {}
    links: dict[str, LinkProfile] = {}
    for m in pool:
        prof = CandidateProfile(m.candidate_id)
        for k in range(5):
            obs = CandidateObservation(
                at_s=float(k),
                delivered=True,
                quality=float(rng.uniform()),
                proc_latency_s=float(rng.uniform(0.5, 5.0)),
                tokens_in=1000,
                tokens_out=300,
            )
            prof = update_candidate(prof, obs, settings)
        cands[m.candidate_id] = prof
    for z in ZONES:
        link = LinkProfile("local", z)
        for k in range(5):
            lo = LinkObservation(float(k), 4000.0, False, float(rng.uniform(0.01, 0.1)), 0.05)
            link = update_link(link, lo, settings)
        links[link_id("local", z)] = link
    return pool, cands, links


def _time_per_call(fn: Callable[[], object], batches: int, batch: int) -> list[float]:
    """Per-call microseconds for each batch."""
    fn()  # warm caches
    out = []
    for _ in range(batches):
        t0 = time.perf_counter_ns()
        for _ in range(batch):
            fn()
        out.append((time.perf_counter_ns() - t0) / batch / 1000.0)
    return out


def _summary(samples: list[float]) -> dict[str, float]:
    return {"median_us": median(samples), "p90_us": lower(samples, 90), "min_us": min(samples)}


def bench_decision(
    sizes: Sequence[int] = (6, 1000), batches: int = 200, seed: int = 0
) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    params = PolicyParams()
    settings = ProfileSettings()
    results: dict[str, Any] = {"sizes": list(sizes), "batches": batches, "cases": []}
    for n in sizes:
        stats = random_stats(n, rng)
        batch = max(1, 20_000 // max(n, 1))

        def alloc_only(s: CandidateArrays = stats) -> object:
            return allocate(s, params)

        alloc = _summary(_time_per_call(alloc_only, batches, batch))
        pool, cands, links = random_profiles(n, rng, settings)

        def full(
            p: list[PoolMember] = pool,
            c: dict[str, CandidateProfile] = cands,
            lk: dict[str, LinkProfile] = links,
        ) -> object:
            arrays = build_arrays(p, "local", c, lk, 4000.0, settings)
            return allocate(arrays, params)

        full_t = _summary(_time_per_call(full, max(20, batches // 4), max(1, batch // 4)))
        results["cases"].append({"candidates": n, "allocate": alloc, "from_profiles": full_t})
    return results
