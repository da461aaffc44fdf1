"""Redis's own time per member report (coordinator/state/member_report.lua), by part.

    python -m bench.reportscript [--n 2000] [--rounds 3] [--json PATH]

The report is the one script every member runs on the server, and Redis shares the
machine's cores with the client and the workers: its server time is a member's CPU too.
Each case sends ``--n`` reports through ``RedisStore.report_member`` to one server
(HACO_REDIS_URL, else an embedded one in a temporary directory) and reads the server's
own microseconds per EVALSHA from ``INFO commandstats`` (nested calls included), after
the profile windows are full (``ProfileSettings`` defaults: 256 latencies, 256
bandwidths), as they are on a busy candidate. The cases, interleaved round by round:

- ``reply``: the reply only (a member that never started);
- ``trace``: reply, outcome claim and trace, nothing to fold;
- ``candidate``, ``link`` (2 legs), ``both``: with the folds;
- ``both, windows counted``: ``both`` onto values that carry no window length (as a
  Python writer leaves them, and as every value was before the script kept the length
  beside its window), so the script counts the windows' numbers: the fold's cost before
  and after that change, side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from rich.table import Table

from bench.console import show
from bench.rtlib import machine, server_info
from coordinator.core.params import ProfileSettings
from coordinator.core.percentiles import median
from coordinator.core.profiles import CandidateObservation, LinkObservation
from coordinator.services.embedded_redis import EmbeddedRedis
from coordinator.state import keys
from coordinator.state.memberops import MemberOutcome, OutcomeLimits
from coordinator.state.store import RedisStore

CASES = ("reply", "trace", "candidate", "link", "both", "both, windows counted")
REPORT = '{"trace": "' + "x" * 1200 + '"}'  # about a member report's JSON size
LIMITS = OutcomeLimits(profile_ttl_s=600.0, trace_maxlen=10_000, trace_ttl_s=600.0)
_LENGTH = re.compile(rb',"recent_[a-zA-Z_]+_n":\d+')


def _outcome(case: str, i: int, now: float) -> MemberOutcome:
    cand = case in ("candidate", "both", "both, windows counted")
    link = case in ("link", "both", "both, windows counted")
    obs = CandidateObservation(now, True, None, 0.8, 0.2 + (i % 97) * 1e-3, 100, 200)
    leg = LinkObservation(now, 1000.0 + i % 89, False, 0.001, 0.02)
    return MemberOutcome(
        f"bench:{case}:{i}", REPORT, 60.0, case != "reply", f"bench:claim:{case}:{i}",
        "bench", f"cand-{case}", obs if cand else None, f"link-{case}", "a", "b",
        (leg, leg) if link else (), "bench", None, 0,
    )  # fmt: skip


def _strip_lengths(r: redis.Redis, case: str) -> None:
    """The case's delta values without their window lengths (client side, untimed)."""
    for key in (keys.delta_candidate(0, f"cand-{case}"), keys.delta_link(0, f"link-{case}")):
        raw = r.get(key)
        if raw is not None:
            value = raw.encode() if isinstance(raw, str) else raw
            r.set(key, _LENGTH.sub(b"", value), keepttl=True)


def server_us(r: redis.Redis, store: RedisStore, case: str, n: int, base: int) -> float:
    """Server µs per report script of ``n`` reports of ``case``."""
    settings, strip = ProfileSettings(), case.endswith("counted")
    total_us, calls = 0, 0
    for i in range(base, base + n):
        if strip:
            _strip_lengths(r, case)
        r.config_resetstat()
        store.report_member(_outcome(case, i, time.time()), settings, LIMITS)
        stat = r.info("commandstats").get("cmdstat_evalsha", {})
        total_us += int(stat.get("usec", 0))
        calls += int(stat.get("calls", 0))
    return total_us / max(1, calls)


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
    med = {c: median(v) for c, v in per.items()}
    counted = median(
        [a / b for a, b in zip(per["both"], per["both, windows counted"], strict=True)]
    )
    return {
        "n": n,
        "rounds": rounds,
        "server_us_per_report": med,
        "kept_over_counted": counted,
        "redis": info,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="reports per case and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the JSON here")
    argv = sys.argv[1:]
    args = parser.parse_args(argv)
    if args.n < 1 or args.rounds < 1:
        parser.error(f"--n and --rounds must be >= 1, got {args.n} and {args.rounds}")
    given, before = os.environ.get("HACO_REDIS_URL"), machine()
    with tempfile.TemporaryDirectory(prefix="haco-reportscript-") as tmp:
        embedded = None if given else EmbeddedRedis(Path(tmp) / "state")
        try:
            url = embedded.start() if embedded is not None else str(given)
            res = run(url, args.n, args.rounds)
        finally:
            if embedded is not None:
                embedded.stop()
    res["command"] = " ".join(["python -m bench.reportscript", *argv])
    res["machine"] = {**before, "loadavg_after": list(os.getloadavg())}
    res["redis"]["source"] = "HACO_REDIS_URL" if given else "embedded"
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
