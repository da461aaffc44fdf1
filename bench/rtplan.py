"""Planning time of bench/runtime.py: what the coordinator spends before the first send,
with pools of 6, 24 and 200 candidates of one role across three zones.

Planning = reading the role's profiles from Redis (one Lua read, decoded per candidate) +
building the policy's view + the allocation rule (Coordinator.view + Haco.choose, all
inside Coordinator._plan; Haco.decide, the rule with every term it computes, beside it).
Every candidate and link has a profile, written through the store's public API as workers
write them, so the view is built from real data. The rule also runs once more with
failure domains (synthetic co-failure evidence: the candidates of a zone fail together),
as it does once a recompute snapshot has them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from rich.table import Table

from bench.console import show
from bench.rtlib import Services
from coordinator.config import HacoSettings
from coordinator.core import cofailure
from coordinator.core.cofailure import CoFailure, PairStats, dependence, fold_groups
from coordinator.core.evidence import build_view, domain_members, link_id, payload_bytes
from coordinator.core.methods import Haco, PoolView
from coordinator.core.params import ProfileSettings
from coordinator.core.percentiles import interpolated, median
from coordinator.core.policy import FixedMemo
from coordinator.core.profiles import CandidateObservation, LinkObservation
from coordinator.core.smallpool import in_floats
from coordinator.runtime.client import HacoClient
from coordinator.runtime.pool import policy_members
from schemas.enums import FailureKind
from schemas.models import Candidate
from schemas.pool import PoolConfig, SimSection

SIZES = (6, 24, 200)
ZONES = ("local", "regional", "global")
ROLE = "plan"
OBSERVATIONS = 8  # per candidate and per link: enough for every statistic to be set
# Bounds each part, so that a slow one (or an --n of many calls) cannot run on for long:
# the slowest part, the uncached profile read at 200 candidates, takes ~3 ms a call.
PART_BUDGET_S = 15.0
ONCE = 5  # calls timed of a once-per-snapshot step (its median is given)
PARTS = (
    "profiles",
    "profiles_uncached",
    "build_view",
    "view",
    "decide",
    "choose",
    "in_floats",
    "decide_with_domains",
    "decide_with_domains_new_view",
    "plan_read",
    "plan",
)


def plan_pool(n: int) -> PoolConfig:
    cands = [
        Candidate(id=f"p{n}-{i}", role=ROLE, model=f"model-{i % 4}", zone=ZONES[i % 3])
        for i in range(n)
    ]
    return PoolConfig(
        caller_zone=ZONES[0], zones=list(ZONES), sim=SimSection(scenario="overall"),
        candidates=cands,
    )  # fmt: skip


def fill_profiles(client: HacoClient, rng: np.random.Generator) -> None:
    """Profiles for every candidate and link of the pool, through RedisStore's writes."""
    s, ttl = ProfileSettings(), client.settings.profile_ttl_s
    now = time.time()
    for c in client.pool.candidates(ROLE):
        for k in range(OBSERVATIONS):
            fail = rng.uniform() < 0.1
            obs = CandidateObservation(
                at_s=now - OBSERVATIONS + k,
                delivered=True,
                failure=FailureKind.INTERNAL if fail else None,
                quality=None if fail else float(rng.uniform(0.3, 1.0)),
                proc_latency_s=float(rng.uniform(0.2, 4.0)),
                tokens_in=800,
                tokens_out=200,
            )
            client.store.update_candidate(c.id, obs, s, ttl)
    caller = client.pool.config.caller_zone
    for z in ZONES:
        rtt = rng.uniform(0.01, 0.1, OBSERVATIONS)
        obs_l = [
            LinkObservation(now - OBSERVATIONS + k, 4000.0, False, 0.002, float(rtt[k]))
            for k in range(OBSERVATIONS)
        ]
        client.store.update_link(link_id(caller, z), caller, z, obs_l, s, ttl)


def zone_cofailure(cands: Sequence[Candidate], rng: np.random.Generator) -> CoFailure:
    """Evidence that the candidates of a zone fail together (every same-zone pair)."""
    pairs: dict[tuple[str, str], PairStats] = {}
    for i, a in enumerate(cands):
        for b in cands[i + 1 :]:
            if a.zone != b.zone:
                continue
            both = [float(rng.uniform() < 0.15) for _ in range(20)]
            groups = [([(a.id, f), (b.id, f)], float(k)) for k, f in enumerate(both)]
            pairs |= fold_groups(CoFailure(), groups, ProfileSettings()).pairs
    return CoFailure(pairs)


def timed(fn: Callable[[], object], iters: int) -> dict[str, float]:
    """Per-call µs of ``iters`` calls, or of as many as fit in PART_BUDGET_S."""
    for _ in range(min(20, iters)):
        fn()  # warm caches and the Lua script's SHA
    out: list[float] = []
    end = time.monotonic() + PART_BUDGET_S
    while len(out) < iters and (len(out) < 10 or time.monotonic() < end):
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1000.0)
    return {"median_us": median(out), "p99_us": interpolated(out, 99)[0], "n": len(out)}


def renewed(view: PoolView) -> PoolView:
    """``view`` as built anew: the same figures in new arrays, so nothing worked out for
    the old arrays (policy's fixed terms and their joint models) serves it."""
    s = view.stats
    fresh = dataclasses.replace(s, alpha=s.alpha.copy(), fixed=FixedMemo())
    return dataclasses.replace(view, stats=fresh)


def _read_then_plan(coord: Any, inv: Any) -> object:
    coord.views.mark_stale(ROLE)  # as after a failure: the view is read
    return coord._plan(inv)


def plan_size(svc: Services, n: int, iters: int, rng: np.random.Generator) -> dict[str, Any]:
    settings = HacoSettings(redis_url=svc.url)
    client = HacoClient(settings, pool=plan_pool(n), redis_url=svc.url)
    try:
        fill_profiles(client, rng)
        coord = client.coordinator
        inv = client.invocation(ROLE, "plan a hedge set for this request")
        call = coord.pool.call_settings(inv, settings, coord.params)
        cands = coord.pool.candidates(ROLE)
        ids = [c.id for c in cands]
        caller = coord.pool.config.caller_zone
        lids = sorted({link_id(caller, c.zone) for c in cands})
        nbytes = payload_bytes(inv.payload)
        profiles, links = coord.store.load_profiles(ids, lids)
        members = policy_members(cands)
        ps = coord.profile_settings
        view = build_view(members, caller, profiles, links, nbytes, ps)
        rule = Haco(call.params)
        evidence = zone_cofailure(cands, rng)
        domains = domain_members(members)
        # Once per snapshot, by the plan that first finds it (runtime.viewing): the
        # evidence decoded, the pool's domains worked out (DependenceMemo).
        dep = dependence(domains, evidence, ps)
        dep_us = timed(lambda: dependence(domains, evidence, ps), ONCE)["median_us"]
        encoded = cofailure.encode(evidence)
        decode_us = timed(lambda: cofailure.decode(encoded), ONCE)["median_us"]
        view_dep = build_view(members, caller, profiles, links, nbytes, ps, dep)
        # The plan's own read (one script; profiles unchanged since the last read are
        # neither sent nor decoded) when the store has it, and every profile read and
        # decoded, as after a change of each (RedisStore.load_profiles).
        plan_read = getattr(coord.store, "read_for_plan", None)
        parts: dict[str, Callable[[], object]] = {
            "profiles": (lambda: plan_read(ids, lids))
            if plan_read is not None
            else (lambda: coord.store.load_profiles(ids, lids)),
            "profiles_uncached": lambda: coord.store.load_profiles(ids, lids),
            "build_view": lambda: build_view(members, caller, profiles, links, nbytes, ps),
            "view": lambda: coord.view(ROLE, nbytes),
            "decide": lambda: rule.decide(view, rng),
            # The runtime's plan (Haco.choose: floats up to smallpool.SMALL_POOL, else
            # decide's numpy), and the float path itself at any size.
            "choose": lambda: rule.choose(view),
            "in_floats": lambda: in_floats(view.stats, call.params),
            "decide_with_domains": lambda: rule.decide(view_dep, rng),
            # The first plan on a view built after a profile changed (the same snapshot's
            # domains): the fixed terms and the joint model worked out for its arrays.
            "decide_with_domains_new_view": lambda: rule.decide(renewed(view_dep), rng),
            # With the role's view read (a failure seen, or plan_view_fresh_s = 0), and
            # on the view read within plan_view_fresh_s (no read: runtime.viewing).
            "plan_read": lambda: _read_then_plan(coord, inv),
            "plan": lambda: coord._plan(inv),
        }
        times = {name: timed(fn, iters) for name, fn in parts.items()}
        decision = rule.decide(view, rng)
        with_dep = rule.decide(view_dep, rng)
    finally:
        client.close()
    return {
        "candidates": n,
        "profiled": len(profiles),
        "times": times,
        "per_candidate_us": {k: v["median_us"] / n for k, v in times.items()},
        "hedge_size": len(decision.members),
        "p_success": decision.p_success,
        "hedge_size_with_domains": len(with_dep.members),
        "domains": 0 if dep is None else len(dep.domains),
        "dependence_once_us": dep_us,
        "evidence_decode_once_us": decode_us,
        "evidence_pairs": len(evidence.pairs),
    }


def planning(svc: Services, sizes: Sequence[int], iters: int, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    cases = [plan_size(svc, n, iters, rng) for n in sizes]
    return {"sizes": list(sizes), "iters": iters, "cases": cases, "bend": bend(cases)}


def bend(cases: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per part, how its median grows from the smallest to the largest pool against the
    pool's growth, and the part that takes the largest share of the plan at the largest."""
    if len(cases) < 2:
        return {}
    lo, hi = cases[0], cases[-1]
    size = hi["candidates"] / lo["candidates"]
    parts = [p for p in PARTS if p in hi["times"] and p in lo["times"]]
    growth = {p: hi["times"][p]["median_us"] / lo["times"][p]["median_us"] for p in parts}
    # Shares of the plan that reads its view (older runs: of the plan).
    whole = hi["times"].get("plan_read", hi["times"]["plan"])["median_us"]
    share = {
        p: hi["times"][p]["median_us"] / whole
        for p in ("profiles", "profiles_uncached", "build_view", "decide")
    }
    return {"size_growth": size, "time_growth": growth, "share_of_plan_at_largest": share}


def show_planning(res: dict[str, Any]) -> None:
    t = Table(title=f"planning, µs median / p99 ({res['iters']} calls per part)")
    t.add_column("part")
    for c in res["cases"]:
        t.add_column(f"{c['candidates']} candidates", justify="right")
    cases = res["cases"]
    for p in PARTS:
        t.add_row(
            p, *(f"{c['times'][p]['median_us']:.0f} / {c['times'][p]['p99_us']:.0f}" for c in cases)
        )
    t.add_row("hedge size", *(str(c["hedge_size"]) for c in cases))
    t.add_row("dependence, once per snapshot", *(f"{c['dependence_once_us']:.0f}" for c in cases))
    t.add_row("evidence decoded, once per snapshot",
              *(f"{c['evidence_decode_once_us']:.0f}" for c in cases))  # fmt: skip
    if all("after_snapshot" in c for c in cases):  # bench.rtsnapshot
        for way in ("worked_out", "published"):
            t.add_row(f"plan after a new snapshot, domains {way.replace('_', ' ')}",
                      *(f"{c['after_snapshot'][f'{way}_us']:.0f}" for c in cases))  # fmt: skip
    show(t)
