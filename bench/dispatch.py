"""What sending a hedge group's members costs the coordinator: Celery's ``send_task``
once per member against :class:`coordinator.runtime.dispatch.CeleryDispatcher`'s
prebuilt messages (:mod:`coordinator.state.celery_wire`) pushed in one pipeline.

Both paths run in this process, on the same app and Redis, interleaved round by round
(groups of 1 and 2 members), after a warm-up (connections made, queues declared). No
worker runs: the queues are emptied between rounds, outside the timed part. "build" is
the new path without its round trip (the messages only). Figures: µs per group.

The broker database (``--db``, 14 by default) is not flushed: the test suite leases
databases 2-14 of the machine's Redis and keeps its leases in 15, and another run may
hold one. The queues here have a name of their own, and their keys (lists and binding
sets) are deleted before and after.

    .venv/bin/python -m bench.dispatch --rounds 2000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis
from rich.table import Table

from bench.console import show
from coordinator.config import HacoSettings
from coordinator.core.percentiles import interpolated
from coordinator.runtime.dispatch import CeleryDispatcher, redacted, sending_app
from coordinator.state.broker import with_db
from coordinator.state.celery_wire import task_args
from coordinator.state.keys import queue_for
from schemas.models import BackendSpec, Candidate, MemberTask, Message

PATHS = ("send_task", "pipeline", "build")
SIZES = (1, 2)


def members(zones: list[str]) -> list[MemberTask]:
    """A group's members, one per zone, with a chat payload of a realistic size."""
    now = time.time()
    tasks = []
    for rank, zone in enumerate(zones):
        cand = Candidate(
            id=f"c{rank}", role="coder", model="m", zone=zone, backend=BackendSpec(kind="http")
        )
        tasks.append(
            MemberTask(
                group_id=uuid.uuid4().hex,
                member_id=f"{uuid.uuid4().hex}.{rank}",
                rank=rank,
                candidate=cand,
                caller_zone=zones[0],
                payload=[Message(role="user", content="plot the sales by month " * 8)],
                deadline_at_s=now + 30.0,
                enqueued_at_s=now,
                u_plus=0.4,
                r_minus=0.1,
            )
        )
    return tasks


Group = list[tuple[str, MemberTask]]


def timed(
    paths: dict[str, Callable[[Group], None]],
    groups: dict[int, Group],
    rounds: int,
    warmup: int,
    empty: Callable[[], object],
) -> dict[str, dict[int, list[float]]]:
    """µs per group of each path and size, the paths' order rotated round by round (no
    path always first); ``empty`` (the queues) every 100 rounds, untimed."""
    times: dict[str, dict[int, list[float]]] = {p: {n: [] for n in groups} for p in paths}
    order = list(paths.items())
    for i in range(warmup + rounds):
        for k in range(len(order)):
            path, send = order[(k + i) % len(order)]
            for n, group in groups.items():
                t0 = time.perf_counter()
                send(group)
                dt = time.perf_counter() - t0
                if i >= warmup:
                    times[path][n].append(dt * 1e6)
        if i % 100 == 0:
            empty()
    return times


def summary(times: dict[str, dict[int, list[float]]]) -> dict[str, dict[str, dict[str, float]]]:
    names = ("p50_us", "p90_us", "p99_us")
    return {
        p: {
            str(n): dict(zip(names, interpolated(v, 50, 90, 99), strict=True))
            for n, v in by_n.items()
        }
        for p, by_n in times.items()
    }


def run(url: str, db: int, rounds: int, warmup: int = 50) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    zones = [f"bench-{tag}-a", f"bench-{tag}-b"]
    broker_url = with_db(url, db)
    app = sending_app(HacoSettings(redis_url=url), url)
    app.conf.broker_url = broker_url
    dispatcher = CeleryDispatcher(app, frozenset(zones))
    wire = dispatcher.wire
    if wire is None:
        raise SystemExit(f"the prebuilt path is off for this app: {dispatcher.fallback}")
    r = redis.Redis.from_url(broker_url)
    queues = [queue_for(z) for z in zones]
    own = [*queues, *(f"_kombu.{k}.{q}" for q in queues for k in ("binding", "binding_permanent"))]

    def old(items: Group) -> None:
        for zone, task in items:
            dispatcher.send_task(zone, task)

    def build(items: Group) -> None:
        reply_to = app.thread_oid
        for zone, task in items:
            args = task_args(task.model_dump_json())  # as CeleryDispatcher builds them
            wire.message(wire.queue(queue_for(zone)), args, reply_to)

    paths: dict[str, Callable[[Group], None]] = {
        "send_task": old,
        "pipeline": dispatcher.send_many,
        "build": build,
    }
    groups = {n: [(t.candidate.zone, t) for t in members(zones[:n])] for n in SIZES}
    r.delete(*own)
    try:
        stats = summary(timed(paths, groups, rounds, warmup, lambda: r.delete(*queues)))
    finally:
        r.delete(*own)
        r.close()
        dispatcher.close()
    speedup = {
        n: stats["send_task"][n]["p50_us"] / stats["pipeline"][n]["p50_us"]
        for n in stats["pipeline"]
    }
    return {"rounds": rounds, "broker": redacted(broker_url), "us_per_group": stats,
            "speedup_p50": speedup}  # fmt: skip


def table(res: dict[str, Any]) -> Table:
    t = Table(title=f"Sending a group's members, µs per group (n={res['rounds']} each)")
    for c in ("path", "members", "p50", "p90", "p99", "speed-up (p50)"):
        t.add_column(c, justify="left" if c == "path" else "right")
    names = {"send_task": "app.send_task × members", "pipeline": "prebuilt + 1 pipeline",
             "build": "  of which building"}  # fmt: skip
    for path in PATHS:
        for n, s in res["us_per_group"][path].items():
            up = f"{res['speedup_p50'][n]:.1f}×" if path == "pipeline" else ""
            t.add_row(names[path], n, *(f"{s[k]:.0f}" for k in ("p50_us", "p90_us", "p99_us")), up)
    return t


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dispatch", description=__doc__)
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0", help="the Redis server")
    parser.add_argument("--db", type=int, default=14, help="the broker database to use")
    parser.add_argument("--rounds", type=int, default=2000, help="timed groups per path")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds={args.rounds}; expected a positive number")
    res = run(args.url, args.db, args.rounds)
    show(table(res))
    json.dump(res, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
