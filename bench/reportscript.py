"""Redis's own time per member report (coordinator/state/member_report.lua, then
member_harvest.lua when the outcome is the worker's), by part.

    python -m bench.reportscript [--n 2000] [--rounds 3] [--json PATH]

The report is the one script every member runs on the server, and Redis shares the
machine's cores with the client and the workers: its server time is a member's CPU too.
Each case sends ``--n`` reports through ``RedisStore.report_member`` to one server
(HACO_REDIS_URL, else an embedded one in a temporary directory; nothing else should use
it meanwhile) and reads the server's own microseconds per EVALSHA from ``INFO
commandstats`` (nested calls included), after the profile windows are full
(``ProfileSettings`` defaults: 256 latencies, 256 bandwidths), as they are on a busy
candidate. The cases, interleaved round by round:

- ``reply``: the reply only (a member that never started);
- ``trace``: reply, outcome claim and trace, nothing to fold;
- ``candidate``, ``link`` (2 legs), ``both``: with the folds.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis
from rich.table import Table

from bench.console import show
from bench.machine import server_info
from bench.rtlib import run_on_redis
from coordinator.core.params import ProfileSettings
from coordinator.core.percentiles import median
from coordinator.core.profiles import CandidateObservation, LinkObservation
from coordinator.state.memberops import MemberOutcome, OutcomeLimits
from coordinator.state.store import RedisStore

CASES = ("reply", "trace", "candidate", "link", "both")
REPORT = '{"trace": "' + "x" * 1200 + '"}'  # about a member report's JSON size
LIMITS = OutcomeLimits(profile_ttl_s=600.0, trace_maxlen=10_000, trace_ttl_s=600.0)


def _outcome(case: str, i: int, now: float) -> MemberOutcome:
    cand, link = case in ("candidate", "both"), case in ("link", "both")
    obs = CandidateObservation(now, True, None, 0.8, 0.2 + (i % 97) * 1e-3, 100, 200)
    leg = LinkObservation(now, 1000.0 + i % 89, False, 0.001, 0.02)
    return MemberOutcome(
        f"bench:{case}:{i}", REPORT, 60.0, case != "reply", f"bench:claim:{case}:{i}",
        "bench", f"cand-{case}", obs if cand else None, f"link-{case}", "a", "b",
        (leg, leg) if link else (), "bench", None, 0,
    )  # fmt: skip


def server_us(r: redis.Redis, store: RedisStore, case: str, n: int, base: int) -> float:
    """Server µs per report (its scripts together) of ``n`` reports of ``case``, sent one
    after another (only this process talks to the server: every EVALSHA counted is one
    of them)."""
    settings = ProfileSettings()
    r.config_resetstat()
    for i in range(base, base + n):
        store.report_member(_outcome(case, i, time.time()), settings, LIMITS)
    stat = r.info("commandstats").get("cmdstat_evalsha", {})
    return int(stat.get("usec", 0)) / n


def run(url: str, n: int, rounds: int) -> dict[str, Any]:
    r = redis.Redis.from_url(url)
    store = RedisStore(r)
    info = server_info(r)
    per: dict[str, list[float]] = {c: [] for c in CASES}
    try:
        r.flushdb()
        for c in CASES:  # the windows full, the script loaded
            server_us(r, store, c, 300, 0)
        for k in range(rounds):
            for c in CASES:
                per[c].append(server_us(r, store, c, n, 1000 + k * n))
    finally:
        r.flushdb()
        r.close()
    return {
        "n": n,
        "rounds": rounds,
        "server_us_per_report": {c: median(v) for c, v in per.items()},
        "redis": info,
    }


def main() -> None:
    res, args = run_on_redis("bench.reportscript", __doc__ or "", (2000, 3), run)
    t = Table(title=f"Redis µs per member report (median of {args.rounds} × {args.n})")
    t.add_column("report")
    t.add_column("server µs", justify="right")
    for c, v in res["server_us_per_report"].items():
        t.add_row(c, f"{v:.1f}")
    show(t)
    text = json.dumps(res, indent=2)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
