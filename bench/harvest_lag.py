"""Harvest lag under the runtime throughput load.

    python -m bench.harvest_lag [--clients 32] [--seconds 20] [--pg-url URL]

Runs the throughput benchmark's load (32 client threads invoking a 1-member role of a
~0 s backend on one worker, `bench/fixtures/runtime_pool.toml`) while a real
`haco harvester` drains the trace stream into a fresh Postgres database, and samples the
stream every 0.25 s: its length, the age of its oldest entry and of the oldest entry
delivered but not acknowledged. After the load stops it measures how long the harvester
takes to empty the stream. Redis: HACO_REDIS_URL, else an embedded server.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from rich.console import Console
from rich.table import Table

from bench.rtbench import _load, wait_ready
from bench.rtlib import Services, timed_client
from bench.scratchdb import scratch_database
from coordinator.config import HacoSettings
from coordinator.state import keys
from coordinator.state.codec import text

SAMPLE_S = 0.25
DRAIN_LIMIT_S = 120.0


def sample(svc: Services, group: str) -> dict[str, float]:
    r = svc.app_redis
    now_ms = time.time() * 1000
    length = int(r.xlen(keys.TRACES))
    oldest = r.xrange(keys.TRACES, count=1)
    age_s = (now_ms - int(text(oldest[0][0] or b"0").split("-")[0])) / 1000 if oldest else 0.0
    pending_s = 0.0
    try:
        rows = r.xpending_range(keys.TRACES, group, min="-", max="+", count=1)
        if rows:
            pending_s = int(rows[0]["time_since_delivered"]) / 1000
    except Exception:  # the group is created by the harvester's first read
        pending_s = 0.0
    return {"length": length, "oldest_entry_s": age_s, "oldest_pending_s": pending_s}


def sampler(svc: Services, group: str, stop: threading.Event, out: list[dict[str, float]]) -> None:
    while not stop.wait(SAMPLE_S):
        out.append(sample(svc, group))


def run(args: argparse.Namespace, tmp: Path, db_url: str) -> dict[str, Any]:
    group = HacoSettings().harvest_group
    svc = Services(tmp, concurrency=16)
    svc.stack.extra_env["HACO_DATABASE_URL"] = db_url
    try:
        svc.flush()
        svc.start_haco()
        svc.stack.start_harvester()
        client, _ = timed_client(svc.url)
        try:
            wait_ready(client, "one", svc)
            samples: list[dict[str, float]] = []
            stop = threading.Event()
            th = threading.Thread(target=sampler, args=(svc, group, stop, samples), daemon=True)
            th.start()
            load = _load(
                lambda i: client.invoke("one", "x", deadline_s=30.0),
                args.clients,
                1.0,
                args.seconds,
                svc.cpu,
            )
            t_end = time.time()
            while svc.app_redis.xlen(keys.TRACES) > 0 and time.time() - t_end < DRAIN_LIMIT_S:
                time.sleep(0.05)
            drain_s = time.time() - t_end
            stop.set()
            th.join(2.0)
        finally:
            client.close()
        with psycopg.connect(db_url) as conn:
            stored = conn.execute("SELECT count(*) FROM members").fetchone()
    finally:
        svc.close()
    lengths = [s["length"] for s in samples]
    return {
        "clients": args.clients,
        "seconds": args.seconds,
        "invocations_per_s": load["calls_per_s"],
        "stream_length": {"median": statistics.median(lengths), "max": max(lengths)},
        "oldest_entry_s": {"max": max(s["oldest_entry_s"] for s in samples)},
        "oldest_pending_s": {"max": max(s["oldest_pending_s"] for s in samples)},
        "drain_after_load_s": drain_s,
        "rows_stored": stored[0] if stored else 0,
        "samples": len(samples),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/test")
    args = ap.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="haco-lag-") as tmp,
        scratch_database(args.pg_url, "haco_lag") as db_url,
    ):
        res = run(args, Path(tmp), db_url)
    t = Table(title=f"harvest lag under load ({args.clients} clients, {args.seconds:.0f} s)")
    for col in (
        "invocations/s",
        "stream len median / max",
        "oldest entry max s",
        "oldest pending max s",
        "drain after load s",
        "rows stored",
    ):
        t.add_column(col, justify="right")
    t.add_row(
        f"{res['invocations_per_s']:.0f}",
        f"{res['stream_length']['median']:.0f} / {res['stream_length']['max']}",
        f"{res['oldest_entry_s']['max']:.2f}",
        f"{res['oldest_pending_s']['max']:.2f}",
        f"{res['drain_after_load_s']:.2f}",
        str(res["rows_stored"]),
    )
    Console(stderr=True, width=150).print(t)
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
