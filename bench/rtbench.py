"""The runtime measurements of bench/runtime.py, each returning a JSON-able dict: the
throughput and the loser's stop time here, the dispatch overhead in bench/rtoverhead.py,
the tail in bench/rttail.py, the growth curves in bench/rtgrowth.py.

Every call has a deadline, every load phase a fixed duration, every thread a join
timeout: nothing here can run unbounded.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis

from bench.bare_celery import create_bare_app, send_echo
from bench.machine import after, machine, server_info
from bench.rtlib import (
    READY_TIMEOUT_S,
    Services,
    count_stream,
    read_traces,
    read_verdicts,
    timed_client,
)
from coordinator.core.percentiles import interpolated, median
from coordinator.runtime.client import HacoClient
from coordinator.runtime.dispatch import await_answers, worker_node
from coordinator.state import keys
from coordinator.state.broker import with_db
from coordinator.state.keys import queue_for

CALL_DEADLINE_S = 30.0
JOIN_TIMEOUT_S = 60.0
HEDGED = {"tau": 0.9999, "winner_mode": "first"}  # τ out of reach: the whole pool runs


def wait_ready(client: HacoClient, role: str, svc: Services) -> None:
    """Until every worker answers a ping, then until a call succeeds. The ping first: a
    member left in a queue that no worker consumes yet past the start timeout declares
    its zone dark (coordinator.runtime.liveness), and every candidate of that zone then
    sits out planning for dark_zone_cooldown_s wherever another zone's candidate can
    run (the two-zones role would run one member). A worker that answers may still fail
    a first call, so one failed call proves nothing."""
    end = time.monotonic() + READY_TIMEOUT_S
    host = socket.gethostname()
    await_answers(client.app, [worker_node(zone, host) for zone in svc.stack.workers], end)
    while True:
        try:
            client.invoke(role, "ready?", deadline_s=READY_TIMEOUT_S)
            return
        except Exception as exc:
            if time.monotonic() > end:
                log = svc.log_tail("local")
                raise RuntimeError(f"HACO worker not ready: {exc}\n{log}") from exc
            time.sleep(0.2)  # a call refused at once (no worker yet) is not retried hot


def on_worker(
    module: str, argv: list[str], concurrency: int, run: Callable[[Services], dict[str, Any]]
) -> dict[str, Any]:
    """``run(svc)`` on one HACO worker of ``concurrency`` threads (Redis: HACO_REDIS_URL,
    else an embedded one in a temporary directory, stopped after), its JSON stamped with
    the command (``python -m module argv``), the machine and the server."""
    before = machine()
    with tempfile.TemporaryDirectory(prefix="haco-bench-") as tmp:
        svc = Services(Path(tmp), concurrency)
        try:
            svc.start_haco()
            res = dict(run(svc))
            res["redis"] = server_info(svc.app_redis)
        finally:
            svc.close()
    res["command"] = " ".join([f"python -m {module}", *argv])
    res["machine"] = after(before)
    res["redis"]["source"] = "HACO_REDIS_URL" if os.environ.get("HACO_REDIS_URL") else "embedded"
    return res


def _drain(svc: Services, limit_s: float = 10.0) -> None:
    """Wait until both broker queues are empty, then a little for the last members."""
    with redis.Redis.from_url(with_db(svc.url, keys.BROKER_DB)) as broker:
        end = time.monotonic() + limit_s
        while time.monotonic() < end and (
            broker.llen(queue_for("local")) or broker.llen("bench.bare")
        ):
            time.sleep(0.05)
    time.sleep(0.3)


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
