"""Growth curve of bench/runtime.py: tasks/s, group latency, dispatch overhead and CPU per
member task at 1, 8, 32 and 128 groups in flight, HACO (1 and 2 members) beside bare
Celery, the systems alternating at each level so that a change of load on the machine
hits them alike.

Under load the dispatch overhead is the HACO group latency minus the fastest member's
own latency (worker-side finished − started, from the trace stream), as in the
sequential overhead bench; bare Celery's comparable figure is its round trip under the
same load. Each process's busy share (CPU s per wall s) shows what saturates: one Python
process runs on about one core (GIL), the machine on os.cpu_count() cores.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
from rich.table import Table

from bench.bare_celery import create_bare_app, send_echo
from bench.console import show
from bench.rtbench import CALL_DEADLINE_S, HEDGED, _drain, load_phase, wait_ready
from bench.rtlib import Services, count_stream, own_latency, read_traces, summary_ms, timed_client
from coordinator.core.percentiles import median
from coordinator.state import keys
from coordinator.state.broker import with_db

LEVELS = (1, 8, 32, 128)
SYSTEMS = ("bare", "haco-1", "haco-2")
WARM_S = 1.0
# A level "bends" when going to it adds less than this share of tasks/s.
BEND_GAIN = 0.10

Row = tuple[float, float, str]  # (call start, call end, group id; "" for bare)


def _phase(
    svc: Services, system: str, call: Callable[[int], str], level: int, dur_s: float
) -> dict[str, Any]:
    rows: list[Row] = []

    def timed(i: int) -> None:
        t0 = time.time()
        gid = call(i)
        rows.append((t0, time.time(), gid))  # list.append is atomic: no lock needed

    since = int(time.time() * 1000)
    res = load_phase(timed, level, WARM_S, dur_s, svc.cpu)
    lo, hi = res.pop("lo"), res.pop("hi")
    done = [x for x in rows if lo <= x[1] < hi]
    if system == "bare":
        res["tasks_per_s"] = res["calls_per_s"]
    else:
        time.sleep(0.2)  # the last members of the window append their traces
        res["tasks_per_s"] = count_stream(svc.app_redis, lo, hi) / dur_s
    tasks = max(1.0, res["tasks_per_s"] * dur_s)
    cpu_s = res.pop("cpu_s")
    res["cpu_ms_per_task"] = {k: v / tasks * 1e3 for k, v in cpu_s.items()}
    res["busy_cores"] = {k: v / dur_s for k, v in cpu_s.items()}
    res["latency_s"] = [t1 - t0 for t0, t1, _ in done]
    if system != "bare":
        traces = read_traces(svc.app_redis, since)
        over = []
        for t0, t1, gid in done:
            ok = [m for m in traces.get(gid, []) if m["status"] == "succeeded"]
            if ok:
                over.append(t1 - t0 - min(own_latency(m) for m in ok))
        res["overhead_s"] = over
        res["missing_traces"] = len(done) - len(over)
    return res


def _worker_key(system: str) -> str:
    return "worker_bare" if system == "bare" else "worker_local"


def _merge(system: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over rounds; latency and overhead percentiles over every call of them."""
    lat = [x for r in runs for x in r.pop("latency_s")]
    over = [x for r in runs for x in r.pop("overhead_s", [])]
    procs = ("client", _worker_key(system), "redis")
    out: dict[str, Any] = {
        "tasks_per_s": median([r["tasks_per_s"] for r in runs]),
        "groups_per_s": median([r["calls_per_s"] for r in runs]),
        "latency": summary_ms(lat),
        "cpu_ms_per_task": {
            p.split("_")[0]: median([r["cpu_ms_per_task"][p] for r in runs]) for p in procs
        },
        "busy_cores": {p.split("_")[0]: median([r["busy_cores"][p] for r in runs]) for p in procs},
        "n_errors": sum(r["n_errors"] for r in runs),
        "errors": [e for r in runs for e in r["errors"]][:3],
        "rounds": [round(r["tasks_per_s"], 1) for r in runs],
    }
    if system != "bare":
        out["overhead"] = summary_ms(over)
        out["missing_traces"] = sum(r["missing_traces"] for r in runs)
    return out


def growth(svc: Services, levels: Sequence[int], dur_s: float, rounds: int) -> dict[str, Any]:
    svc.start_haco()
    svc.start_bare()
    client, _ = timed_client(svc.url)
    # redis-py 8 caps a client's pool at 100 connections by default, and every call in
    # flight holds one in its blocking pop: at 128 in flight both sides would fail with
    # MaxConnectionsError. Room for every level, the same on both sides.
    room = max(levels) + 32
    client.redis.connection_pool.max_connections = room
    # As in rtbench.throughput: Celery's default producer pool on both sides.
    bare = create_bare_app(svc.url, svc.concurrency)
    r = redis.Redis.from_url(with_db(svc.url, keys.APP_DB), max_connections=room)
    opts: dict[str, dict[str, Any]] = {
        "haco-1": {"deadline_s": CALL_DEADLINE_S},
        "haco-2": {**HEDGED, "launch_mode": "parallel", "deadline_s": CALL_DEADLINE_S},
    }

    def bare_call(i: int) -> str:
        send_echo(bare, f"bench:bare:{i}", "x")
        if r.brpop([f"bench:bare:{i}"], timeout=CALL_DEADLINE_S) is None:
            raise RuntimeError("bare reply lost")
        return ""

    def haco(system: str) -> Callable[[int], str]:
        role = "one" if system == "haco-1" else "two"
        return lambda i: client.invoke(role, "x", **opts[system]).group_id

    calls = {"bare": bare_call, "haco-1": haco("haco-1"), "haco-2": haco("haco-2")}
    points = []
    try:
        wait_ready(client, "one", svc)
        bare_call(0)  # readiness of the bare worker
        for level in levels:
            runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SYSTEMS}
            for _ in range(rounds):
                for system in SYSTEMS:
                    runs[system].append(_phase(svc, system, calls[system], level, dur_s))
                    _drain(svc)
            merged = {s: _merge(s, v) for s, v in runs.items()}
            bare_tps = merged["bare"]["tasks_per_s"]
            for s in SYSTEMS[1:]:
                merged[s]["ratio_to_bare"] = merged[s]["tasks_per_s"] / max(bare_tps, 1e-9)
            points.append({"inflight": level, "systems": merged})
    finally:
        client.close()
        bare.close()
        r.close()
    return {
        "levels": list(levels),
        "duration_s": dur_s,
        "rounds": rounds,
        "concurrency": svc.concurrency,
        "cpus": os.cpu_count(),
        "points": points,
        "bends": bends(points),
    }


def bends(points: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per system: the first level whose tasks/s gain over the previous one falls under
    BEND_GAIN, and the busiest process there (the likely ceiling)."""
    out: dict[str, Any] = {}
    for s in SYSTEMS:
        found: dict[str, Any] | None = None
        for prev, cur in itertools.pairwise(points):
            a, b = prev["systems"][s]["tasks_per_s"], cur["systems"][s]["tasks_per_s"]
            if b < a * (1.0 + BEND_GAIN):
                busy = cur["systems"][s]["busy_cores"]
                proc = max(busy, key=lambda p: busy[p])
                found = {
                    "from": prev["inflight"],
                    "to": cur["inflight"],
                    "gain": b / max(a, 1e-9) - 1.0,
                    "busiest": proc,
                    "busiest_cores": busy[proc],
                    "total_cores": sum(busy.values()),
                }
                break
        out[s] = found
    return out


def show_growth(res: dict[str, Any]) -> None:
    t = Table(
        title=f"growth: groups in flight ({res['rounds']}×{res['duration_s']:g} s per system and "
        f"level, worker concurrency {res['concurrency']})"
    )
    cols = ("in flight", "system", "tasks/s", "vs bare", "latency p50/p99 ms")
    for c in (*cols, "overhead p50/p99 ms", "CPU ms/task c·w·r", "busy cores c·w·r", "errors"):
        t.add_column(c, justify="right")
    for pt in res["points"]:
        for s, v in pt["systems"].items():
            o = v.get("overhead")
            cpu, busy = v["cpu_ms_per_task"], v["busy_cores"]
            t.add_row(
                str(pt["inflight"]),
                s,
                f"{v['tasks_per_s']:.0f}",
                f"{v['ratio_to_bare']:.0%}" if "ratio_to_bare" in v else "—",
                f"{v['latency']['p50_ms']:.2f} / {v['latency']['p99_ms']:.2f}",
                "—" if o is None else f"{o['p50_ms']:.2f} / {o['p99_ms']:.2f}",
                " · ".join(f"{cpu[p]:.2f}" for p in ("client", "worker", "redis")),
                " · ".join(f"{busy[p]:.2f}" for p in ("client", "worker", "redis")),
                str(v["n_errors"]),
            )
    show(t)
