"""Many invocations awaited at once in one process: HacoClient.ainvoke's async core
(coordinator/runtime/aio.py) against the thread-per-call path it replaced.

    python -m bench.inflight_api [--n 2000] [--hold-s 15] [--shards 8] [--json PATH]

One HacoClient on a dedicated Redis (HACO_REDIS_URL, flushed: DB 0; else an embedded
server in a temp dir) with three cold candidates, so every invocation launches three
members. The members are answered in this process by a responder instead of Celery
workers: ``--hold-s`` after a member's send, the workers' own ``execute_member`` runs it
with an instant backend on a small thread pool (its own Redis connections, named
``haco-bench-members``), so its report reaches the group's reply list as a worker's does,
and the member side holds no thread per call. While every invocation is waiting (the
plateau: the hub holds ``--n`` groups), the run samples the server's client connections
(CLIENT LIST, less the responder's and the sampler's), the process's threads, and its
resident memory over the baseline, per in-flight invocation. Table on stderr, one JSON
object on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import redis
from rich.table import Table

from bench.console import show
from coordinator.config import HacoSettings
from coordinator.runtime.client import HacoClient
from coordinator.runtime.dispatch import send_each
from coordinator.runtime.results import InvocationResult
from coordinator.services.embedded_redis import EmbeddedRedis
from coordinator.state import keys
from coordinator.state.broker import with_db
from coordinator.state.opening import GroupOpening
from coordinator.state.store import RedisStore
from schemas.models import BackendSpec, Candidate, MemberTask
from schemas.pool import PoolConfig
from workers.backends.base import BackendResult, StopCheck
from workers.member import MemberContext, execute_member

MEMBERS = "haco-bench-members"
SAMPLER = "haco-bench-sampler"
PAGE = os.sysconf("SC_PAGE_SIZE")


class Instant:
    """A backend that answers at once (the hold is the responder's)."""

    def call(self, task: MemberTask, should_stop: StopCheck) -> BackendResult:
        return BackendResult(None, output="ok", quality=0.8, proc_latency_s=0.01, tokens_out=4)

    def commit(self, task: MemberTask) -> None:
        """No side effect to commit."""


class Responder:
    """A dispatcher that runs each member ``hold_s`` after its send, on a few threads."""

    def __init__(self, url: str, settings: HacoSettings, hold_s: float, threads: int) -> None:
        client = redis.Redis.from_url(with_db(url, keys.APP_DB), client_name=MEMBERS)
        backend = Instant()
        self.ctx = MemberContext(
            store=RedisStore(client), backends=lambda _t: backend, settings=settings
        )
        self.hold_s = hold_s
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="bench-member")
        self.client = client

    def send(self, zone: str, task: MemberTask) -> None:
        loop = asyncio.get_running_loop()  # ainvoke sends from the event loop
        loop.call_later(self.hold_s, self.pool.submit, execute_member, task, self.ctx)

    def send_many(
        self, items: Sequence[tuple[str, MemberTask]], opening: GroupOpening | None = None
    ) -> None:
        send_each(self.send, items, opening)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.client.close()


def pool_config() -> PoolConfig:
    cands = [
        Candidate(
            id=f"c{i}", role="coder", model="m", zone="local", backend=BackendSpec(kind="http")
        )
        for i in range(3)
    ]
    return PoolConfig(caller_zone="local", zones=["local"], candidates=cands)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def connections(sampler: redis.Redis) -> dict[str, int]:
    clients = sampler.client_list()
    names = [c.get("name", "") for c in clients]
    mine = [n for n in names if n not in (MEMBERS, SAMPLER)]
    return {
        "coordinator": len(mine),
        "hub": sum(1 for n in mine if n.startswith("haco-hub-")),
        "responder": names.count(MEMBERS),
    }


async def run(client: HacoClient, args: argparse.Namespace, sampler: redis.Redis) -> dict[str, Any]:
    base_rss, base_threads = rss_bytes(), threading.active_count()
    plateau: dict[str, Any] = {}
    hub = client.hubs.current()

    async def watch() -> None:
        while not plateau:
            if hub.waiting >= args.n:
                plateau_at = time.perf_counter() - t0  # every invocation planned and sent
                await asyncio.sleep(args.hold_s / 2)  # every shard in its BRPOP, none answered
                if hub.waiting < args.n:
                    return  # the members answered first: no plateau to sample
                plateau.update(
                    connections=connections(sampler),
                    threads=threading.active_count() - base_threads,
                    rss_per_invocation=(rss_bytes() - base_rss) / args.n,
                    admitted_s=plateau_at,
                )
            await asyncio.sleep(0.01)

    t0 = time.perf_counter()
    watcher = asyncio.create_task(watch())
    calls = [client.ainvoke("coder", "hi", deadline_s=args.deadline_s) for _ in range(args.n)]
    results = await asyncio.gather(*calls, return_exceptions=True)
    elapsed = time.perf_counter() - t0
    watcher.cancel()
    await client.hubs.aclose()
    errors = [f"{type(r).__name__}: {r}" for r in results if isinstance(r, BaseException)]
    done = [r for r in results if isinstance(r, InvocationResult)]
    return {
        "n": args.n,
        "completed": len(done),
        "errors": len(errors),
        "first_errors": errors[:3],
        "elapsed_s": elapsed,
        "plateau_reached": bool(plateau),
        **plateau,
    }


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.inflight_api", description=__doc__)
    p.add_argument("--n", type=int, default=2000, help="invocations awaited at once")
    p.add_argument("--hold-s", type=float, default=15.0, help="each member's answer delay")
    p.add_argument("--deadline-s", type=float, default=60.0)
    p.add_argument("--shards", type=int, default=8, help="HACO_HUB_SHARDS")
    p.add_argument("--threads", type=int, default=8, help="the responder's threads")
    p.add_argument("--json", type=Path, default=None)
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    settings = HacoSettings(
        hub_shards=args.shards,
        start_timeout_min_s=args.deadline_s,  # the responder's queue is no dark zone
        patience_min_s=args.deadline_s,
        default_deadline_s=args.deadline_s,
    )
    with tempfile.TemporaryDirectory(prefix="haco-inflight-api-") as tmp:
        embedded = None
        url = os.environ.get("HACO_REDIS_URL")
        if not url:
            embedded = EmbeddedRedis(Path(tmp) / "state")
            url = embedded.start()
        try:
            sampler = redis.Redis.from_url(with_db(url, keys.APP_DB), client_name=SAMPLER)
            sampler.flushdb()
            client = HacoClient(settings, pool=pool_config(), redis_url=url)
            responder = Responder(url, settings, args.hold_s, args.threads)
            client.coordinator.dispatcher = responder
            try:
                out = asyncio.run(run(client, args, sampler))
            finally:
                responder.close()
                client.close()
                sampler.close()
        finally:
            if embedded is not None:
                embedded.stop()
    table = Table(title=f"{args.n} invocations awaited at once (ainvoke, {args.shards} shards)")
    for col in (
        "completed",
        "errors",
        "elapsed s",
        "coordinator conns",
        "hub conns",
        "threads",
        "RSS/inv",
    ):
        table.add_column(col, justify="right")
    conns = out.get("connections", {})
    table.add_row(
        str(out["completed"]), str(out["errors"]), f"{out['elapsed_s']:.2f}",
        str(conns.get("coordinator", "—")), str(conns.get("hub", "—")),
        str(out.get("threads", "—")), f"{out.get('rss_per_invocation', 0) / 1024:.1f} KiB",
    )  # fmt: skip
    show(table)
    text = json.dumps(out, indent=2)
    if args.json is not None:
        args.json.write_text(text + "\n")
    print(text)
    return 0 if out["errors"] == 0 and out["plateau_reached"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
