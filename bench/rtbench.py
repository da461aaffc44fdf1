"""The four runtime measurements of bench/runtime.py, each returning a JSON-able dict.

Every call has a deadline, every load phase a fixed duration, every thread a join
timeout: nothing here can run unbounded.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import redis

from bench.bare_celery import create_bare_app, send_echo
from bench.rtlib import (
    READY_TIMEOUT_S,
    ZONE2,
    Marks,
    Services,
    count_stream,
    own_latency,
    read_traces,
    read_verdicts,
    summary_ms,
    timed_client,
)
from coordinator.core.percentiles import interpolated, median
from coordinator.runtime.client import HacoClient
from coordinator.state import keys
from coordinator.state.broker import with_db
from coordinator.state.keys import queue_for

CALL_DEADLINE_S = 30.0
JOIN_TIMEOUT_S = 60.0
HEDGED = {"tau": 0.9999, "winner_mode": "first"}  # τ out of reach: the whole pool runs


def wait_ready(client: HacoClient, role: str, svc: Services) -> None:
    """Until a call succeeds: a worker still starting fails a call whose member waits
    longer than the start timeout in its queue, so one failed call proves nothing."""
    end = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            client.invoke(role, "ready?", deadline_s=READY_TIMEOUT_S)
            return
        except Exception as exc:
            if time.monotonic() > end:
                log = svc.log_tail("local")
                raise RuntimeError(f"HACO worker not ready: {exc}\n{log}") from exc
            time.sleep(0.2)  # a call refused at once (no worker yet) is not retried hot


def _drain(svc: Services, limit_s: float = 10.0) -> None:
    """Wait until both broker queues are empty, then a little for the last members."""
    with redis.Redis.from_url(with_db(svc.url, keys.BROKER_DB)) as broker:
        end = time.monotonic() + limit_s
        while time.monotonic() < end and (
            broker.llen(queue_for("local")) or broker.llen("bench.bare")
        ):
            time.sleep(0.05)
    time.sleep(0.3)


# ---------------------------------------------------------------- 1. dispatch overhead


def _breakdown(t0: float, t1: float, gid: str, m: dict[str, Any], marks: Marks) -> dict[str, float]:
    """Consecutive stages of one group (they add up to its latency), for member ``m``."""
    sent = marks.sent[gid]
    first = min(s for s, _ in sent.values())
    woke = marks.woke.get(gid, t1)
    return {
        "plan": first - t0,  # profiles, delay window, decision, group open, budget earn
        "dispatch": m["started_at_s"] - first,  # send_task(s) → broker → worker → task start
        "backend": own_latency(m),  # the member's own latency
        "reply": woke - m["finished_at_s"],  # report, LPUSH, BRPOP wake-up
        "finish": t1 - woke,  # verdict, group state, metrics, winner claim
        "(send_task call)": sent[m["rank"]][1] - sent[m["rank"]][0],  # inside dispatch
    }


Row = tuple[str, float, float, float, str]  # group id, caller's start and end, latency_s, winner
OVERHEAD_ROUNDS = 10  # blocks per system, interleaved: a slow spell falls on each alike
TWO_MEMBERS = {**HEDGED, "launch_mode": "parallel"}


def _haco_calls(client: HacoClient, role: str, n: int, opts: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for _ in range(n):
        t0 = time.time()
        res = client.invoke(role, "x", deadline_s=CALL_DEADLINE_S, **opts)
        rows.append((res.group_id, t0, time.time(), res.latency_s, res.winner_id or ""))
    return rows


def _bare_calls(app: Any, r: redis.Redis, n: int) -> list[float]:
    out: list[float] = []
    for i in range(n):
        t0 = time.perf_counter()
        send_echo(app, "bench:bare:lat", str(i))
        if r.brpop(["bench:bare:lat"], timeout=READY_TIMEOUT_S) is None:
            raise RuntimeError("bare worker silent")
        out.append(time.perf_counter() - t0)
    return out


Started = tuple[float, list[dict[str, Any]], str]  # first send, succeeded members, winner


def _by_start(groups: list[Started]) -> dict[str, Any] | None:
    """The members of multi-member groups in the order they started (``groups``: each
    group's first send, its succeeded members and its winner): each one's start after
    the send and own latency at p50, and how often the first to start was the fastest
    and the winner."""
    multi = [(f, sorted(ms, key=lambda m: m["started_at_s"]), w) for f, ms, w in groups]
    multi = [(f, ms, w) for f, ms, w in multi if len(ms) > 1]
    if not multi:
        return None
    size = min(len(ms) for _, ms, _ in multi)
    order = [
        {
            "start_after_send_p50_ms": median([ms[i]["started_at_s"] - f for f, ms, _ in multi])
            * 1e3,
            "own_p50_ms": median([own_latency(ms[i]) for _, ms, _ in multi]) * 1e3,
        }
        for i in range(size)
    ]
    fastest = sum(1 for _, ms, _ in multi if own_latency(ms[0]) <= min(map(own_latency, ms)))
    won = sum(1 for _, ms, w in multi if ms[0]["member_id"] == w)
    n = len(multi)
    return {
        "groups": n, "members": order, "first_started_fastest": fastest / n,
        "first_started_won": won / n,
    }  # fmt: skip


def _haco_summary(
    role: str, rows: list[Row], traces: dict[str, list[dict[str, Any]]], marks: Marks
) -> dict[str, Any]:
    """Group latency minus the fastest member's own latency (and minus its drawn backend
    time alone), and the stages."""
    e2e, coord, over_e2e, over_coord, beyond = [], [], [], [], []
    parts: dict[str, list[float]] = {}
    groups: list[Started] = []
    missing = 0
    for gid, t0, t1, lat, winner in rows:
        done = [m for m in traces.get(gid, []) if m["status"] == "succeeded"]
        if not done:
            missing += 1  # its trace is not in the stream (yet): left out
            continue
        groups.append((min(s for s, _ in marks.sent[gid].values()), done, winner))
        m = min(done, key=own_latency)
        e2e.append(t1 - t0)
        coord.append(lat)
        over_e2e.append(t1 - t0 - own_latency(m))
        over_coord.append(lat - own_latency(m))
        if drawn := [float(x["proc_latency_s"]) for x in done if x.get("proc_latency_s")]:
            beyond.append(t1 - t0 - min(drawn))
        for k, v in _breakdown(t0, t1, gid, m, marks).items():
            parts.setdefault(k, []).append(v)
    return {
        "role": role,
        "members": len(traces.get(rows[0][0], [])) if rows else 0,
        "missing_traces": missing,
        "group_e2e": summary_ms(e2e),
        "group_coordinator": summary_ms(coord),
        "overhead": summary_ms(over_e2e),
        "overhead_coordinator": summary_ms(over_coord),
        # Less the fastest member's drawn backend time alone (its trace's proc_latency_s):
        # the member's own latency also holds its start's round trip, its thread's
        # hand-off and the simulated backend's own work, which this counts as the runtime's.
        "beyond_draw": summary_ms(beyond) if beyond else None,
        "breakdown_p50_ms": {k: interpolated(v, 50)[0] * 1e3 for k, v in parts.items()},
        "breakdown_p99_ms": {k: interpolated(v, 99)[0] * 1e3 for k, v in parts.items()},
        "by_start_order": _by_start(groups),
    }


def overhead(svc: Services, n: int, rounds: int = OVERHEAD_ROUNDS) -> dict[str, Any]:
    """Sequential calls of bare Celery (send_task → the worker's LPUSH → BRPOP) and of
    HACO with one member, two members in one zone (one worker runs both) and, when
    ``svc`` runs a worker in ZONE2 too, two members in two zones (a worker each), ``n``
    each, in ``rounds`` interleaved blocks (bare, one, two, …): compared side by side in
    time, not one after the other, so a slow spell of the machine weighs on each alike."""
    client, marks = timed_client(svc.url)
    app = create_bare_app(svc.url)
    r = svc.app_redis
    bare: list[float] = []
    rows: dict[str, list[Row]] = {"one": [], "two": []}
    if ZONE2 in svc.stack.workers:
        rows["two-zones"] = []
    opts = {"one": {}, "two": TWO_MEMBERS, "two-zones": TWO_MEMBERS}
    try:
        for role in rows:
            wait_ready(client, role, svc)
            for _ in range(20):
                client.invoke(role, "warm", deadline_s=CALL_DEADLINE_S, **opts[role])
        try:
            _bare_calls(app, r, 20)  # warm
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n{svc.log_tail('bare')}") from exc
        since = int(time.time() * 1000)
        sizes = [n // rounds + (1 if i < n % rounds else 0) for i in range(rounds)]
        for size in sizes:
            bare += _bare_calls(app, r, size)
            for role in rows:
                rows[role] += _haco_calls(client, role, size, opts[role])
        time.sleep(0.3)  # losers still report
    finally:
        client.close()
        app.close()
    traces = read_traces(svc.app_redis, since)
    out = {
        "rounds": rounds,
        "bare_celery_roundtrip": summary_ms(bare),
        "haco_1": _haco_summary("one", rows["one"], traces, marks),
        "haco_2": _haco_summary("two", rows["two"], traces, marks),
    }
    if "two-zones" in rows:
        out["haco_2_zones"] = _haco_summary("two-zones", rows["two-zones"], traces, marks)
    return out


# ---------------------------------------------------------------- 2. throughput


def load_phase(
    call: Callable[[int], object],
    clients: int,
    warm_s: float,
    dur_s: float,
    cpu: Callable[[], dict[str, float]],
) -> dict[str, Any]:
    """``clients`` threads calling in a loop; completions and CPU inside the timed window."""
    stop = threading.Event()
    done: list[list[float]] = [[] for _ in range(clients)]
    errors: list[str] = []

    def loop(i: int) -> None:
        while not stop.is_set():
            try:
                call(i)
            except Exception as exc:
                if len(errors) < 100:
                    errors.append(repr(exc)[:200])
                time.sleep(0.01)
                continue
            done[i].append(time.time())

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    lo = time.time() + warm_s
    hi = lo + dur_s
    time.sleep(max(0.0, lo - time.time()))
    cpu0 = cpu()
    time.sleep(max(0.0, hi - time.time()))
    cpu1 = cpu()
    stop.set()
    for t in threads:
        t.join(JOIN_TIMEOUT_S)
    n = sum(1 for ts in done for t in ts if lo <= t < hi)
    used = {k: cpu1[k] - cpu0[k] for k in cpu0}
    return {
        "lo": lo,
        "hi": hi,
        "calls_per_s": n / dur_s,
        "cpu_s": used,
        "errors": errors[:5],
        "n_errors": len(errors),
    }


_load = load_phase  # the name bench/harvest_lag.py imports


@contextlib.contextmanager
def load_calls(svc: Services) -> Iterator[dict[str, Callable[[int], None]]]:
    """The throughput load's calls, for :func:`load_phase`: bare Celery's echo task and
    HACO's one- and two-member calls, with both workers started and answering; the
    clients closed after."""
    svc.start_haco()
    svc.start_bare()
    client, _ = timed_client(svc.url)
    bare = create_bare_app(svc.url, svc.concurrency)
    r = redis.Redis.from_url(with_db(svc.url, keys.APP_DB))
    opts2 = {**HEDGED, "launch_mode": "parallel", "deadline_s": CALL_DEADLINE_S}
    opts1 = {"deadline_s": CALL_DEADLINE_S}

    def bare_call(i: int) -> None:
        send_echo(bare, f"bench:bare:{i}", "x")
        if r.brpop([f"bench:bare:{i}"], timeout=CALL_DEADLINE_S) is None:
            raise RuntimeError("bare reply lost")

    def haco1(i: int) -> None:
        client.invoke("one", "x", **opts1)

    def haco2(i: int) -> None:
        client.invoke("two", "x", **opts2)

    try:
        wait_ready(client, "one", svc)
        bare_call(0)  # readiness of the bare worker
        yield {"bare": bare_call, "haco-1": haco1, "haco-2": haco2}
    finally:
        client.close()
        bare.close()
        r.close()


def tasks_done(svc: Services, system: str, res: dict[str, Any]) -> float:
    """Member tasks ``system`` completed in a load phase's window: bare Celery's calls,
    HACO's members (the trace stream's entries)."""
    if system == "bare":
        return float(res["calls_per_s"]) * float(res["hi"] - res["lo"])
    return float(count_stream(svc.app_redis, res["lo"], res["hi"]))


def throughput(svc: Services, clients: int, dur_s: float, rounds: int) -> dict[str, Any]:
    with load_calls(svc) as phases:
        runs: dict[str, list[dict[str, Any]]] = {k: [] for k in phases}
        for _ in range(rounds):
            for name, call in phases.items():
                res = load_phase(call, clients, 1.0, dur_s, svc.cpu)
                res["tasks_per_s"] = tasks_done(svc, name, res) / dur_s
                tasks = max(1.0, res["tasks_per_s"] * dur_s)
                res["cpu_ms_per_task"] = {k: v / tasks * 1e3 for k, v in res.pop("cpu_s").items()}
                runs[name].append(res)
                _drain(svc)
    med = {k: median([x["tasks_per_s"] for x in v]) for k, v in runs.items()}
    cpu = {
        k: {p: median([x["cpu_ms_per_task"][p] for x in v]) for p in v[0]["cpu_ms_per_task"]}
        for k, v in runs.items()
    }
    # One Python process runs on one core at a time (GIL): 1 s / its CPU per task bounds
    # it; the machine's cores bound the sum of every process's CPU per task.
    ceiling = {}
    for k, c in cpu.items():
        worker = c["worker_bare" if k == "bare" else "worker_local"]
        total = c["client"] + worker + c["redis"]
        ceiling[k] = {
            "client": 1e3 / c["client"],
            "worker": 1e3 / worker,
            "machine": 1e3 * (os.cpu_count() or 1) / total,
        }
    return {
        "clients": clients,
        "duration_s": dur_s,
        "rounds": rounds,
        "concurrency": svc.concurrency,
        "bare_events": svc.bare_events,
        "median_tasks_per_s": med,
        "median_groups_per_s": {k: median([x["calls_per_s"] for x in v]) for k, v in runs.items()},
        "ratio_to_bare": {k: med[k] / med["bare"] for k in med if k != "bare"},
        "cpu_ms_per_task": cpu,
        "ceiling_tasks_per_s": ceiling,
        "runs": {
            k: [{kk: vv for kk, vv in x.items() if kk not in ("lo", "hi")} for x in v]
            for k, v in runs.items()
        },
    }


# ---------------------------------------------------------------- 4. loser stop time


def loser(svc: Services, n: int) -> dict[str, Any]:
    svc.start_haco()
    client, marks = timed_client(svc.url, cancel_losers=True)
    opts = {**HEDGED, "launch_mode": "parallel", "deadline_s": CALL_DEADLINE_S}
    gids: list[str] = []
    try:
        wait_ready(client, "one", svc)
        since = int(time.time() * 1000)
        for _ in range(n):
            gids.append(client.invoke("stop", "x", **opts).group_id)
        time.sleep(0.5)  # the last loser stops and reports
    finally:
        client.close()
    traces = read_traces(svc.app_redis, since)
    verdicts = read_verdicts(svc.app_redis, since)
    stops: list[float] = []
    not_started = 0
    statuses: dict[str, int] = {}
    for gid in gids:
        # The cancel: the coordinator's close, or the winner's report that closed the
        # group (a staged close: coordinator.state.closing), when its verdict was decided.
        declared = marks.cancelled.get(gid) or verdicts[gid]["decided_at_s"]
        for m in traces.get(gid, []):
            if m["candidate_id"] != "stop-slow":
                continue
            statuses[m["status"]] = statuses.get(m["status"], 0) + 1
            stops.append(m["finished_at_s"] - declared)
            not_started += m["started_at_s"] >= declared
    p50, p95, p99 = interpolated(stops, 50, 95, 99)
    return {
        "n": n,
        "reported": len(stops),
        "loser_status": statuses,
        "loser_not_started_at_declaration": not_started,
        "stop_p50_ms": p50 * 1e3,
        "stop_p95_ms": p95 * 1e3,
        "stop_p99_ms": p99 * 1e3,
        "stop_max_ms": max(stops) * 1e3 if stops else math.nan,
    }
