"""Where a call's time goes on its worker: the member's own window taken apart.

    python -m bench.memberstamps [--n 1000] [--rounds 10] [--concurrency 16] [--json PATH]

The dispatch overhead of the issue-12 goals (bench/rtoverhead.py) is a group's latency
less its fastest member's own time, the trace's ``finished_at_s − started_at_s``. That
window opens when the worker takes the member (workers.member.begin_member), before the
member's start claim, so it holds more than the backend's call: the claim's round trip
(for a member that wakes an idle lane, in the round trip that records its message,
``lane_start.lua``), the hand-off to the member's run, the backend's call itself (for
the simulated backend: its draw, its wait and its result) and what follows the call up
to the finish stamp. This bench runs HACO's worker with stamps at those points
(:mod:`bench.stampedworker`) and counts the same calls both ways: less the fastest
member's own time (the goals' figure) and less the fastest backend call alone, with one
member and with two in parallel (the overhead bench's roles ``one`` and ``two``), beside
bare Celery's round trip of an echo task, in interleaved blocks of the same run.

Its calls are the overhead bench's without that bench's stage marks in the caller, in
blocks of its own: its two counts are to be compared with each other, within one run,
not with the overhead bench's figures. A call
whose members lack a trace or a stamp is left out and counted (``missing``).
Redis is HACO_REDIS_URL, else embedded; one HACO worker and one bare worker, each with
``--concurrency`` threads.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.bare_celery import create_bare_app
from bench.console import emit
from bench.inflight import wait_until
from bench.machine import after, machine, server_info
from bench.rtbench import wait_ready
from bench.rtlib import ZONE, Services, bench_client, read_traces, summary_ms
from bench.rtoverhead import TWO_MEMBERS, Row, bare_calls, haco_calls
from bench.stampedworker import Stamp, StampedServices, read_stamps, stamps_file

# After the last call: how long its members' stamps (written every FLUSH_S) and traces
# may take to show; a call still without them then is left out and counted.
SETTLE_S = 5.0
SETTLE_POLL_S = 0.05  # each look reads the trace stream and the stamps file again
WARMUP = 50  # unmeasured calls of each kind: connections made, scripts loaded
ROUNDS = 10  # blocks per kind, interleaved: a slow spell falls on each alike
ROLES = {"one": ("haco_1", {}), "two": ("haco_2", TWO_MEMBERS)}  # role → key, options

PARTS = {
    "call": "HACO's call, the caller's start to its answer",
    "less_own": "· less the fastest member's own time (the goals' overhead)",
    "less_backend": "· less the fastest backend call alone",
    "own": "the fastest member's own time (finished − started)",
    "claim": "· its start claim's round trip",
    "handoff": "· the hand-off to its run, the backend built",
    "backend": "· its backend's call",
    "beyond_draw": "  · of it beyond the drawn latency",
    "after": "· after the call, to the finish stamp",
}


def split(
    rows: list[Row], traces: dict[str, list[dict[str, Any]]], stamps: dict[str, Stamp]
) -> tuple[dict[str, list[float]], int]:
    """Each call taken apart, in seconds, by :data:`PARTS` (the parts of the window of
    its fastest member, the one with the smallest own time, as the overhead bench counts
    it), and how many calls were left out: no succeeded member, or a succeeded member
    without its stamps."""
    parts: dict[str, list[float]] = {k: [] for k in PARTS}
    missing = 0
    for gid, t0, t1, *_ in rows:
        done = [m for m in traces.get(gid, []) if m["status"] == "succeeded"]
        got = [stamps.get(m["member_id"]) for m in done]
        if not done or any(s is None or s[0] <= 0.0 for s in got):
            missing += 1
            continue
        ss = [s for s in got if s is not None]
        i = min(range(len(done)), key=lambda j: _own(done[j]))
        m, (made, c0, c1) = done[i], ss[i]
        started, finished = float(m["started_at_s"]), float(m["finished_at_s"])
        e2e, drawn = t1 - t0, float(m.get("proc_latency_s") or 0.0)
        values = {
            "call": e2e, "own": finished - started, "claim": made - started,
            "handoff": c0 - made, "backend": c1 - c0, "beyond_draw": c1 - c0 - drawn,
            "after": finished - c1, "less_own": e2e - (finished - started),
            "less_backend": e2e - min(b - a for _, a, b in ss),
        }  # fmt: skip
        for k, v in values.items():
            parts[k].append(v)
    return parts, missing


def _own(trace: dict[str, Any]) -> float:
    return float(trace["finished_at_s"]) - float(trace["started_at_s"])


def run(svc: Services, n: int, rounds: int = ROUNDS, warmup: int = WARMUP) -> dict[str, Any]:
    """``n`` bare round trips and ``n`` calls of each role in ``rounds`` interleaved
    blocks, after ``warmup`` of each; ``svc``'s HACO worker is stamped
    (:class:`bench.stampedworker.StampedServices`)."""
    client = bench_client(svc.url)
    app = create_bare_app(svc.url)
    r = svc.app_redis
    bare: list[float] = []
    rows: dict[str, list[Row]] = {role: [] for role in ROLES}
    try:
        for role, (_, opts) in ROLES.items():
            wait_ready(client, role, svc)
            haco_calls(client, role, warmup, opts)
        bare_calls(app, r, warmup)
        size = max(1, n // rounds)
        while len(bare) < n:
            k = min(size, n - len(bare))
            bare += bare_calls(app, r, k)
            for role, (_, opts) in ROLES.items():
                rows[role] += haco_calls(client, role, k, opts)[0]
    finally:
        client.close()
        app.close()
    path = stamps_file(svc.tmp, ZONE)
    last = [rs[-1] for rs in rows.values()]  # each role's last call, the last to settle

    def settled() -> bool:
        return split(last, read_traces(r), read_stamps(path))[1] == 0

    wait_until(settled, SETTLE_S, interval_s=SETTLE_POLL_S)
    stamps, traces = read_stamps(path), read_traces(r)
    res: dict[str, Any] = {"n": n, "rounds": rounds, "bare_roundtrip": summary_ms(bare)}
    for role, (key, _) in ROLES.items():
        parts, missing = split(rows[role], traces, stamps)
        res[key] = {"missing": missing, **{k: summary_ms(v) for k, v in parts.items() if v}}
    res["ratios"] = ratios(res)
    return res


def ratios(res: dict[str, Any]) -> dict[str, float]:
    """Each way of counting against bare Celery's round trip (1 member), and 2 members
    against 1, at p50 and p99."""
    one, two, bare = res["haco_1"], res["haco_2"], res["bare_roundtrip"]
    out: dict[str, float] = {}
    for k in ("less_own", "less_backend"):
        for q in ("p50_ms", "p99_ms"):
            if k in one:
                out[f"one_{k}_over_bare_{q[:3]}"] = one[k][q] / bare[q]
            if k in one and k in two:
                out[f"two_over_one_{k}_{q[:3]}"] = two[k][q] / one[k][q]
    return out


def table(res: dict[str, Any]) -> Table:
    bare = res["bare_roundtrip"]
    t = Table(
        title="a call and its fastest member's own window, ms (p50 · p99)",
        caption=f"{res['n']} calls of each kind, {res['rounds']} interleaved blocks; "
        f"bare Celery's round trip (echo task) {bare['p50_ms']:.3f} · {bare['p99_ms']:.3f}",
    )
    t.add_column("part")
    for role in ROLES:
        t.add_column(f"{role}: p50 · p99", justify="right")
        t.add_column("p50 / bare", justify="right")
    for k, name in PARTS.items():
        cells = [name]
        for key, _ in ROLES.values():
            s = res[key].get(k)
            cells += ["—", "—"] if s is None else [
                f"{s['p50_ms']:.3f} · {s['p99_ms']:.3f}", f"{s['p50_ms'] / bare['p50_ms']:.2f}"
            ]  # fmt: skip
        t.add_row(*cells)
    t.add_row(
        "calls left out", *[c for key, _ in ROLES.values() for c in (str(res[key]["missing"]), "")]
    )
    return t


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--n", type=int, default=1000, help="calls of each kind")
    p.add_argument("--rounds", type=int, default=ROUNDS, help="interleaved blocks")
    p.add_argument("--concurrency", type=int, default=16, help="threads of each worker")
    p.add_argument("--json", type=Path, help="also write the JSON here")
    args = p.parse_args(argv)
    if args.n < 10 or not 1 <= args.rounds <= args.n or args.concurrency < 1:
        p.error(
            f"--n must be >= 10, --rounds in 1..n, --concurrency >= 1; got {args.n}, "
            f"{args.rounds} and {args.concurrency}"
        )
    before = machine()
    with tempfile.TemporaryDirectory(prefix="haco-bench-") as tmp:
        svc = StampedServices(Path(tmp), args.concurrency)
        try:
            svc.start_haco()
            svc.start_bare()
            res = run(svc, args.n, args.rounds)
            res["redis"] = server_info(svc.app_redis)
            res["redis"]["source"] = "embedded" if svc.embedded else "HACO_REDIS_URL"
        finally:
            svc.close()
    res["command"] = " ".join(["python -m bench.memberstamps", *argv])
    res["machine"] = after(before)
    emit(res, table(res), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
