"""Where a staggered backup's launch lag goes, from its timer to its send.

    python -m bench.launchlag [--n 2000] [--json PATH]

The tail bench (bench/rttail.py) reports the backup's lag as one number: rank 1's send
after rank 0's, minus the hedge delay. This bench splits it, on the tail bench's role,
backend and goal variant (rolling p95 delay, 5% budget), with sequential calls (the tail
bench's ``--inflight 1``). A backup is due at rank 0's launch (from its trace) plus the
call's delay; its timer runs the process's lead earlier (coordinator.runtime.lead: the
median of the paths below, once a few backups measured it). For each call that launched
a backup:

- **timer late**: the wake token's push began after the timer's time (the due time less
  the lead): the timer thread's wake-up;
- **to the caller**: the caller's pop came back with the token after the push began: the
  push's trip to Redis and the blocked pop's answer, through two thread wake-ups;
- **to the spend**: the caller's tick, up to the budget's spend;
- **spend**: the budget's round trip (``HedgeBudget.try_spend``);
- **to the send**: the member's task built, up to its send.

Their sum is the path from the timer to the send's start; **due → send** is the send's
lateness against the due time (the path less the lead: about zero with a lead that fits
the path, the whole path without one). Redis is HACO_REDIS_URL, else
embedded; one worker with ``--concurrency`` threads.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import redis
from rich.table import Table

from bench.console import emit
from bench.hotpath_goals import TAIL_VARIANT
from bench.rtbench import CALL_DEADLINE_S, on_worker, wait_ready
from bench.rtlib import Marks, Services, TimedStore, read_traces, summary_ms, timed_client
from bench.rttail import VARIANTS
from coordinator.config import HacoSettings
from coordinator.runtime.coordinator import WAKE
from coordinator.state.budget import RedisBudget

WARMUP = 300  # unmeasured calls that fill the role's delay window
STAGES = ("timer_late", "to_caller", "to_spend", "spend", "to_send")


class LagMarks:
    """Per group: when its wake token's push began and when its pop returned it; the
    last spend's ends (calls are sequential, so the last spend is the current call's)."""

    def __init__(self) -> None:
        self.pushed: dict[str, float] = {}
        self.woke: dict[str, float] = {}
        self.spend: tuple[float, float] | None = None


class LagStore(TimedStore):
    def __init__(self, client: redis.Redis, marks: Marks, lag: LagMarks) -> None:
        super().__init__(client, marks)
        self.lag = lag

    def push_reply(self, group_id: str, raw: str, ttl_s: float) -> None:
        if raw == WAKE:
            self.lag.pushed.setdefault(group_id, time.time())
        super().push_reply(group_id, raw, ttl_s)

    def pop_replies(self, group_id: str, timeout_s: float, max_n: int) -> list[str]:
        got = super().pop_replies(group_id, timeout_s, max_n)
        if WAKE in got:
            self.lag.woke.setdefault(group_id, time.time())
        return got


class LagBudget(RedisBudget):
    def __init__(self, client: redis.Redis, settings: HacoSettings, lag: LagMarks) -> None:
        super().__init__(client, settings)
        self.lag = lag

    def try_spend(self, backups: int, llm_tokens: float) -> bool:
        t0 = time.time()
        try:
            return super().try_spend(backups, llm_tokens)
        finally:
            self.lag.spend = (t0, time.time())


def stages(
    timer_s: float, pushed_s: float, woke_s: float, spend: tuple[float, float], sent_s: float
) -> dict[str, float]:
    """One backup's consecutive stages, s (they add up to ``sent_s − timer_s``)."""
    return {
        "timer_late": pushed_s - timer_s,
        "to_caller": woke_s - pushed_s,
        "to_spend": spend[0] - woke_s,
        "spend": spend[1] - spend[0],
        "to_send": sent_s - spend[1],
    }


def run(svc: Services, n: int) -> dict[str, Any]:
    opts, settings = VARIANTS[TAIL_VARIANT]
    client, marks = timed_client(svc.url, **settings)
    lag = LagMarks()
    coord = client.coordinator
    coord.store = LagStore(client.redis, marks, lag)
    coord.budget = LagBudget(client.redis, coord.settings, lag)
    rows: list[tuple[str, float, float, tuple[float, float]]] = []  # group, delay, lead, spend
    try:
        wait_ready(client, "tail", svc)
        for _ in range(WARMUP):
            client.invoke("tail", "warm", deadline_s=CALL_DEADLINE_S, **opts)
        since = int(time.time() * 1000)
        for _ in range(n):
            marks.local.delay = float("nan")
            lag.spend = None
            lead_s = coord.lead.lead_s()  # what this call's timer will run early by
            res = client.invoke("tail", "x", deadline_s=CALL_DEADLINE_S, **opts)
            if res.backups and lag.spend is not None:
                rows.append((res.group_id, marks.local.delay, lead_s, lag.spend))
    finally:
        client.close()
    traces = read_traces(svc.app_redis, since)
    parts: dict[str, list[float]] = {k: [] for k in STAGES}
    total: list[float] = []
    leads: list[float] = []
    for gid, delay_s, lead_s, spend in rows:
        first = [m for m in traces.get(gid, []) if m["rank"] == 0]
        if not first or gid not in lag.pushed or gid not in lag.woke or 1 not in marks.sent[gid]:
            continue  # rank 0's trace not in the stream yet (the last call's), or no token
        m = first[0]
        due = m["finished_at_s"] - m["latency_s"] + delay_s  # rank 0's launch + delay
        sent = marks.sent[gid][1][0]
        timer = due - min(lead_s, delay_s)  # as the launcher clamps it
        for k, v in stages(timer, lag.pushed[gid], lag.woke[gid], spend, sent).items():
            parts[k].append(v)
        total.append(sent - due)
        leads.append(lead_s)
    return {
        "calls": n,
        "backups": len(rows),
        "measured": len(total),
        "stages": {k: summary_ms(v) for k, v in parts.items()},
        "lead": summary_ms(leads),
        "due_to_send": summary_ms(total),
        "settings": settings,
    }


def table(res: dict[str, Any]) -> Table:
    t = Table(
        title="a backup's launch, from its timer to its send, ms",
        caption=f"{res['measured']} backups of {res['calls']} sequential calls, {TAIL_VARIANT}",
    )
    for c in ("stage", "p50", "p90", "p99"):
        t.add_column(c, justify="left" if c == "stage" else "right")
    rows = [*res["stages"].items(), ("lead", res["lead"]), ("due → send", res["due_to_send"])]
    for name, s in rows:
        if not s:
            continue
        t.add_row(name, *(f"{s[f'p{q}_ms']:.3f}" for q in (50, 90, 99)))
    return t


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--n", type=int, default=2000, help="measured calls (5%% launch a backup)")
    p.add_argument("--concurrency", type=int, default=16, help="threads of the worker")
    p.add_argument("--json", type=Path, help="also write the JSON here")
    args = p.parse_args(argv)
    if args.n < 1 or args.concurrency < 1:
        p.error(f"--n and --concurrency must be >= 1, got {args.n} and {args.concurrency}")
    res = on_worker("bench.launchlag", argv, args.concurrency, lambda svc: run(svc, args.n))
    emit(res, table(res), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
