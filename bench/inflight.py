"""Issue 8: cancellation's Redis cost and the calls one worker process holds in flight.

    python -m bench.inflight [ops|worker|all] [--members 1000] [--calls 10,2] [--json PATH]

``ops``: ``--members`` members run at once in this process (execute_member, RedisStore on
a dedicated Redis server, a backend that holds each call for its length), once per call
length and per cancel mode: ``polling`` (no watcher: the member reads its group's state
every cancel_poll_s, the code before issue 8) and ``watcher`` (the process's cancel
watcher). The Redis server's commands per second while every member is in flight
(INFO ``total_commands_processed`` deltas), and its commands per member over the whole run.
A tenth of the groups are cancelled mid-call: every one of their members must stop.

``worker``: one real ``haco worker --concurrency N`` process (a Celery threads pool) and
``--worker-members`` member tasks of a simulated 2 s model at time scale
``--worker-scale``; the peak of members running at once, swept from their reports'
started/finished times, and the server's commands/s on that plateau. ``--worker-tree
PATH`` runs the worker from another checkout (the commit before: its polling members).

Redis is ``HACO_REDIS_URL`` (flushed: DB 0 and 1) or an embedded server in a temp dir.
Tables on stderr, one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from rich.table import Table

from bench.console import show
from bench.machine import machine, server_info
from bench.rtlib import BENCH, ZONE, Services, summary_ms
from coordinator.config import HacoSettings
from coordinator.runtime.dispatch import sending_app
from coordinator.state import keys
from coordinator.state.broker import with_db
from coordinator.state.cancelwatch import RedisCancelWatcher
from coordinator.state.keys import MEMBER_TASK, queue_for
from coordinator.state.store import RedisStore
from schemas.enums import FailureKind, GroupSignal
from schemas.models import BackendSpec, Candidate, MemberReport, MemberTask, Message
from workers.backends.base import BackendResult, StopCheck, WaitableStop
from workers.member import MemberContext, execute_member

GOALS = {"worker_peak_inflight": 500}
GROUP_SIZE = 2  # members per hedge group
CANCEL_EVERY = 10  # one group in ten is cancelled mid-call
RAMPED = 0.95  # the plateau is measured once this share of the members is in flight
TTL_S = 600.0
QUIET_S = 30.0  # worker: the replies are over once none came for this long


class HoldBackend:
    """Holds every call ``call_s``: waits on the cancel watcher's stop check, or checks
    the plain one every ``poll_s`` (the simulated backend's two ways)."""

    def __init__(self, call_s: float, poll_s: float) -> None:
        self.call_s, self.poll_s = call_s, poll_s
        self.lock = threading.Lock()
        self.active = self.started = 0
        self._idle = threading.Event()

    def call(self, task: MemberTask, should_stop: StopCheck) -> BackendResult:
        with self.lock:
            self.active += 1
            self.started += 1
        try:
            return self._hold(should_stop)
        finally:
            with self.lock:
                self.active -= 1

    def _hold(self, should_stop: StopCheck) -> BackendResult:
        end = time.monotonic() + self.call_s
        while not should_stop():
            left = end - time.monotonic()
            if left <= 0:
                return BackendResult(None, output="ok", quality=0.8, proc_latency_s=self.call_s)
            if isinstance(should_stop, WaitableStop):
                should_stop.wait(left)
            else:
                self._idle.wait(min(left, self.poll_s))
        return BackendResult(FailureKind.CANCELLED, "cancelled while running")

    def commit(self, task: MemberTask) -> None:
        return None


def commands(r: redis.Redis) -> int:
    return int(r.info("stats")["total_commands_processed"])


def member_task(group_id: str, rank: int, cand: Candidate, deadline_s: float) -> MemberTask:
    now = time.time()
    return MemberTask(
        group_id=group_id,
        member_id=f"{group_id}.{rank}",
        rank=rank,
        candidate=cand,
        caller_zone=ZONE,
        payload=[Message(role="user", content="hold")],
        deadline_at_s=now + deadline_s,
        enqueued_at_s=now,
        sim_seed=rank,
    )


def wait_until(probe: Callable[[], bool], limit_s: float, interval_s: float = 0.02) -> bool:
    end = time.monotonic() + limit_s
    while not probe():
        if time.monotonic() > end:
            return False
        time.sleep(interval_s)
    return True


# ---------------------------------------------------------------- ops: Redis cost


def run_load(url: str, n: int, call_s: float, mode: str) -> dict[str, Any]:
    settings = HacoSettings()
    app = with_db(url, keys.APP_DB)
    pool = redis.BlockingConnectionPool.from_url(
        app, max_connections=settings.worker_redis_connections, timeout=60
    )
    r = redis.Redis(connection_pool=pool)
    store, backend = RedisStore(r), HoldBackend(call_s, settings.cancel_poll_s)
    watcher = None
    if mode == "watcher":
        watcher = RedisCancelWatcher(r, settings.cancel_watch_idle_s, settings.cancel_watch_retry_s)
    ctx = MemberContext(store, lambda _t: backend, settings, cancels=watcher)
    cand = Candidate(id="hold", role="r", model="hold", zone=ZONE, backend=BackendSpec(kind="http"))
    groups = [f"{mode}-{call_s}-{g}" for g in range(n // GROUP_SIZE)]
    for gid in groups:
        store.open_group(gid, TTL_S)
    reports: list[MemberReport] = []
    errors: list[str] = []

    def member(i: int) -> None:
        task = member_task(groups[i // GROUP_SIZE], i % GROUP_SIZE, cand, call_s + 120)
        try:
            reports.append(execute_member(task, ctx))
        except Exception as exc:  # counted and shown: a lost member is a failed run
            errors.append(repr(exc))

    threads = [threading.Thread(target=member, args=(i,), daemon=True) for i in range(n)]
    c0, t0 = commands(r), time.monotonic()
    for t in threads:
        t.start()
    all_in = wait_until(lambda: backend.active >= n * RAMPED, call_s * 0.3)
    out = _plateau(r, backend, call_s, t0)
    # The cancels come from another client, as from a coordinator in another process.
    with redis.Redis.from_url(app) as coordinator:
        out["cancel_stop_ms"] = _cancel(RedisStore(coordinator), groups, reports, call_s, t0)
    for t in threads:
        t.join(call_s + 120)
    total = commands(r) - c0
    if watcher is not None:
        watcher.close()
    r.close()
    pool.disconnect()
    cancelled = sum(1 for rep in reports if rep.trace.failure_kind is FailureKind.CANCELLED)
    expected = len(groups[::CANCEL_EVERY]) * GROUP_SIZE
    return {
        "mode": mode,
        "call_s": call_s,
        "members": n,
        "all_in_flight": all_in,
        **out,
        "commands_per_member": round(total / n, 1),
        "reports": len(reports),
        "cancelled": cancelled,
        "cancelled_expected": expected,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
    }


def _plateau(r: redis.Redis, backend: HoldBackend, call_s: float, t0: float) -> dict[str, Any]:
    """Commands/s while the members are in flight (from when RAMPED of them are, or 30%
    into the call), up to just before the cancels."""
    start, c_start, active = time.monotonic(), commands(r), backend.active
    end = t0 + call_s * 0.45
    time.sleep(max(0.2, end - start))
    dt, dc = time.monotonic() - start, commands(r) - c_start
    flying = max(1.0, (active + backend.active) / 2)
    return {
        "plateau_s": round(dt, 2),
        "plateau_ops_per_s": round(dc / dt),
        "in_flight": [active, backend.active],
        "ops_per_member_s": round(dc / dt / flying, 2),
    }


def _cancel(
    store: RedisStore, groups: list[str], reports: list[MemberReport], call_s: float, t0: float
) -> dict[str, float] | None:
    """Cancel one group in ten at half the call; ms from the cancel to each member's end."""
    time.sleep(max(0.0, t0 + call_s * 0.5 - time.monotonic()))
    at: dict[str, float] = {}
    for gid in groups[::CANCEL_EVERY]:
        at[gid] = time.time()
        store.set_group_state(gid, GroupSignal.CANCELLED, TTL_S)
    wait_until(lambda: sum(1 for rep in reports if rep.trace.group_id in at) >= len(at) * 2, 30)
    stops = [
        rep.trace.finished_at_s - at[rep.trace.group_id]
        for rep in list(reports)
        if rep.trace.group_id in at and rep.trace.failure_kind is FailureKind.CANCELLED
    ]
    return summary_ms(stops) if stops else None


def run_ops(svc: Services, args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    for call_s in args.calls:
        for mode in ("polling", "watcher"):
            svc.flush()
            rows.append(run_load(svc.url, args.members, call_s, mode))
    t = Table(title=f"Redis commands with {args.members} members in flight (server-wide)")
    for col in ("mode", "call s", "ops/s in flight", "ops/s per member", "cmds/member",
                "cancelled", "stop p50/p99 ms"):  # fmt: skip
        t.add_column(col, justify="right")
    for row in rows:
        stop = row["cancel_stop_ms"] or {}
        t.add_row(
            row["mode"], f"{row['call_s']:g}", str(row["plateau_ops_per_s"]),
            str(row.get("ops_per_member_s")), str(row["commands_per_member"]),
            f"{row['cancelled']}/{row['cancelled_expected']}",
            f"{stop.get('p50_ms', 0):.1f} / {stop.get('p99_ms', 0):.1f}",
        )  # fmt: skip
    show(t)
    return {"rows": rows}


# ---------------------------------------------------------------- worker: in flight


def peak_overlap(spans: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in spans] + [(f, -1) for _, f in spans])
    peak = cur = 0
    for _, step in events:
        cur += step
        peak = max(peak, cur)
    return peak


def sampler(r: redis.Redis, stop: threading.Event, out: list[tuple[float, int]]) -> None:
    while not stop.wait(0.5):
        out.append((time.time(), commands(r)))


def run_worker(svc: Services, args: argparse.Namespace) -> dict[str, Any]:
    svc.flush()
    svc.start_haco()
    n, scale = args.worker_members, args.worker_scale
    scenario = str(BENCH / "fixtures" / "runtime_scenario.toml")
    spec = BackendSpec(
        kind="sim",
        settings={"candidate": "stop-slow", "sim": {"scenario": scenario, "time_scale": scale}},
    )
    cand = Candidate(id="stop-slow", role="stop", model="slow", zone=ZONE, backend=spec)
    settings, store = HacoSettings(), RedisStore(svc.app_redis)
    gid = "inflight"
    store.open_group(gid, TTL_S)
    app = sending_app(settings, svc.url)
    samples: list[tuple[float, int]] = []
    stop = threading.Event()
    thread = threading.Thread(target=sampler, args=(svc.app_redis, stop, samples), daemon=True)
    thread.start()
    t0 = time.time()
    for i in range(n):  # defaults left out: a --worker-tree of an older schema reads it
        payload = member_task(gid, i, cand, 300.0).model_dump(mode="json", exclude_defaults=True)
        app.send_task(MEMBER_TASK, args=[payload], queue=queue_for(ZONE))
    spans = _collect(store, gid, n, 2.0 * scale + 120)
    stop.set()
    thread.join()
    return _worker_result(args, spans, samples, t0)


def _collect(store: RedisStore, gid: str, n: int, limit_s: float) -> list[tuple[float, float]]:
    spans: list[tuple[float, float]] = []
    end = time.monotonic() + limit_s
    quiet = time.monotonic() + QUIET_S
    while len(spans) < n and time.monotonic() < min(end, quiet):
        raw = store.pop_reply(gid, 1.0)
        if raw is not None:
            quiet = time.monotonic() + QUIET_S
        if raw is not None and raw.startswith("{"):  # not a start notice (liveness)
            t = MemberReport.model_validate_json(raw).trace
            if t.failure_kind is None:
                spans.append((t.started_at_s, t.finished_at_s))
    return spans


def _worker_result(
    args: argparse.Namespace,
    spans: list[tuple[float, float]],
    samples: list[tuple[float, int]],
    t0: float,
) -> dict[str, Any]:
    peak = peak_overlap(spans)
    last_start = max((s for s, _ in spans), default=t0)
    first_end = min((f for _, f in spans), default=t0)
    flat = [(t, c) for t, c in samples if last_start <= t <= first_end]
    ops = (flat[-1][1] - flat[0][1]) / (flat[-1][0] - flat[0][0]) if len(flat) >= 2 else None
    res = {
        "concurrency": args.concurrency,
        "members": args.worker_members,
        "call_s": 2.0 * args.worker_scale,
        "succeeded": len(spans),
        "peak_in_flight": peak,
        "all_started_after_s": round(last_start - t0, 2),
        "plateau_ops_per_s": None if ops is None else round(ops),
        "goal": GOALS["worker_peak_inflight"],
    }
    t = Table(title="one worker process, calls in flight (goal ≥ 500)")
    for k in res:
        t.add_column(k, justify="right")
    t.add_row(*(str(v) for v in res.values()))
    show(t)
    return res


# ---------------------------------------------------------------- main


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bench", nargs="?", default="all", choices=("ops", "worker", "all"))
    p.add_argument("--members", type=int, default=1000, help="ops: members in flight")
    p.add_argument("--calls", default="10,2", help="ops: call lengths, s (comma-separated)")
    p.add_argument("--concurrency", type=int, default=640, help="worker: threads")
    p.add_argument("--worker-members", type=int, default=600, help="worker: member tasks")
    p.add_argument("--worker-scale", type=float, default=10.0, help="worker: × a 2 s call")
    p.add_argument("--worker-tree", type=Path, help="worker: run this checkout's code")
    p.add_argument("--json", type=Path, help="also write the JSON report here")
    args = p.parse_args(argv)
    args.calls = [float(x) for x in str(args.calls).split(",") if x]
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    report: dict[str, Any] = {"machine": machine(), "goals": GOALS, "results": {}}
    runners = {"ops": run_ops, "worker": run_worker}
    names = list(runners) if args.bench == "all" else [args.bench]
    with tempfile.TemporaryDirectory(prefix="haco-inflight-") as tmp:
        svc = Services(Path(tmp), args.concurrency)
        if args.worker_tree is not None:  # e.g. a `git worktree` of the commit before
            svc.stack.extra_env["PYTHONPATH"] = str(args.worker_tree.resolve())
            report["worker_tree"] = str(args.worker_tree)
        report["redis"] = server_info(svc.app_redis)
        try:
            for name in names:
                t0 = time.monotonic()
                report["results"][name] = runners[name](svc, args)
                report["results"][name]["wall_s"] = round(time.monotonic() - t0, 1)
                svc.stop_workers()
        finally:
            svc.close()
    text = json.dumps(report, indent=2, default=str)
    if args.json is not None:
        args.json.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
