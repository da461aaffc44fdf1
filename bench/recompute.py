"""Recompute benchmark: profile recomputation over 1M member rows, and how fast a snapshot
is adopted by another process.

    python -m bench.recompute [--rows 1000000] [--candidates 24] [--repeats 3]

Creates a throwaway database in the Postgres at --pg-url (dropped at the end), applies
the migrations, COPYs --rows synthetic member rows (finished within the last day, stream
ids increasing with the finish times, as the trace stream's do; the link observations
are a view of them, migration 0006). Then:

- aggregation: the recompute's SQL (coordinator.tracestore.recompute.aggregate) over every row,
  median of --repeats, with no decay (the default) and with a half-life in observations
  and in seconds (rows packed by Postgres, weighted in numpy);
- co-failure: the recompute's other read, the groups' co-failure evidence
  (coordinator.tracestore.cofailuresql, its SQL and its fold), with no decay;
- recompute: a whole ``recompute()`` (seal, wait, aggregate, insert, publish) on Redis
  database --redis-url (flushed first and last), median of --repeats, with the
  co-failure read on a second connection at the same time as the profiles' (as
  ``recompute_once`` runs it) and, alternating with it, on the same connection after it,
  then (two connections) with a half-life in observations;
- adoption: a second process polls ``RedisStore.load_view`` (what every invocation
  does) for the pool's candidates; the main process publishes --samples snapshots and
  the poller reports when it first saw each version. Latency = seen - publish started
  (encoding the snapshot + one MULTI), p50/p95; apart: the publish itself, the time from
  the end of the publish to the sighting (bounded by one load_view round, whose p50 is
  reported too);
- peak memory: how far one read (the profiles without and with decay, the co-failure
  read) raises the peak resident set of a fresh process.

A rich table goes to stderr, JSON to stdout.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import redis
from rich.console import Console
from rich.table import Table

from bench.scratchdb import scratch_database
from coordinator.config import HacoSettings
from coordinator.core.params import DecayUnit, ProfileSettings
from coordinator.core.percentiles import lower
from coordinator.state import epochs
from coordinator.state.store import RedisStore
from coordinator.tracestore.cofailuresql import aggregate_cofailure
from coordinator.tracestore.profilesql import aggregate
from coordinator.tracestore.recompute import recompute

ZONES = ("us", "eu", "ap")
COLUMNS = (
    "member_id, group_id, candidate_id, role, zone, caller_zone, model, rank, started_at, "
    "finished_at, status, failure_kind, failure_reason, quality, latency_s, proc_latency_s, "
    "tokens_in, tokens_out, bytes_sent, rtt_s, bandwidth_bps, lost, stream_id"
)


def stream_id(i: int, n: int, ms0: int) -> str:
    """Row ``i``'s stream id: the millisecond it finished in, as the trace stream's own
    ids run (Redis names an entry by the time it is added), so the rows span the day's
    hours as a deployment's do."""
    return f"{ms0 + i * 86_000_000 // n}-{i % 4}"


def rows(n: int, candidates: int, t0: datetime, ms0: int) -> Iterator[tuple[Any, ...]]:
    span = 86_000.0 / n  # seconds between finishes: the rows span the last day
    for i in range(n):
        c = i % candidates
        zone = ZONES[c % 3]
        kind = ("internal", "network", None, None, None, None, None, None, None, None)[i % 10]
        end = t0 + timedelta(seconds=i * span)
        ok = kind is None
        yield (
            f"m{i}", f"g{i // 3}", f"cand-{c}", "coder", zone, "eu", "sim", i % 3,
            end - timedelta(seconds=1.2), end, "succeeded" if ok else "failed", kind,
            None if ok else "boom", (i % 97) / 97 if ok else None, 1.3,
            0.5 + (i % 53) / 10 if ok else None, 512, 256 if ok else 0, 2048,
            0.08 if kind != "network" else None, 2e6 if kind != "network" else None,
            kind == "network", stream_id(i, n, ms0),
        )  # fmt: skip


def load(url: str, n: int, candidates: int) -> tuple[str, float]:
    """COPY the rows, ANALYZE; returns the watermark and COPY s."""
    t0 = datetime.now(UTC) - timedelta(days=1)
    ms0 = int(t0.timestamp() * 1000)
    with psycopg.connect(url, autocommit=True) as conn:
        start = time.perf_counter()
        with conn.cursor() as cur, cur.copy(f"COPY members ({COLUMNS}) FROM STDIN") as copy:
            for row in rows(n, candidates, t0, ms0):
                copy.write_row(row)
        copy_s = time.perf_counter() - start
        conn.execute("ANALYZE members")
    return stream_id(n - 1, n, ms0), copy_s


def _timed(url: str, repeats: int, read: Callable[[Any, datetime, datetime], Any]) -> list[float]:
    """Seconds of ``read(conn, since, now)`` over the last week, --repeats times."""
    now = datetime.now(UTC)
    out = []
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(repeats):
            start = time.perf_counter()
            got = read(conn, now - timedelta(days=7), now)
            out.append(time.perf_counter() - start)
            assert got, f"{read.__name__} read nothing"
    return out


def time_aggregate(url: str, watermark: str, cfg: ProfileSettings, repeats: int) -> list[float]:
    def profiles(conn: Any, since: datetime, now: datetime) -> Any:
        return aggregate(conn, watermark, since, now, cfg)[0]

    return _timed(url, repeats, profiles)


def time_cofailure(url: str, watermark: str, cfg: ProfileSettings, repeats: int) -> list[float]:
    """The recompute's other read: the co-failure evidence of the groups (SQL and fold)."""

    def cofailure(conn: Any, since: datetime, now: datetime) -> Any:
        return aggregate_cofailure(conn, watermark, since, now, cfg).pairs

    return _timed(url, repeats, cofailure)


def _peak_kib() -> int:
    """This process's peak resident set (Linux's VmHWM). Not ru_maxrss: a spawned child
    starts with its parent's peak there, as Linux carries it across fork and exec."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status: the memory figure needs Linux")


def _read_peak(url: str, watermark: str, cfg: ProfileSettings, read: str, q: Any) -> None:
    """In a fresh process: how far one read raises the peak resident set (KiB)."""
    now = datetime.now(UTC)
    with psycopg.connect(url, autocommit=True) as conn:
        before = _peak_kib()
        if read == "profiles":
            aggregate(conn, watermark, now - timedelta(days=7), now, cfg)
        else:
            aggregate_cofailure(conn, watermark, now - timedelta(days=7), now, cfg)
        q.put(_peak_kib() - before)


def read_peak_mb(url: str, watermark: str, cfg: ProfileSettings, read: str) -> float:
    """The peak memory one read adds to a fresh process (MiB)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_read_peak, args=(url, watermark, cfg, read, q))
    proc.start()
    kib = q.get(timeout=120)
    proc.join(10)
    return float(kib) / 1024


def time_recompute(
    url: str, redis_url: str, repeats: int, decay: ProfileSettings
) -> tuple[list[dict[str, Any]], ...]:
    """Whole recomputes, alternating: the two reads on two connections, then on one, then
    on two with the profile settings ``decay``."""
    client = redis.Redis.from_url(redis_url)
    s = HacoSettings(recompute_wait_s=5.0)
    two: list[dict[str, Any]] = []
    one: list[dict[str, Any]] = []
    decayed: list[dict[str, Any]] = []
    try:
        with (
            psycopg.connect(url, autocommit=True) as conn,
            psycopg.connect(url, autocommit=True) as other,
        ):
            for _ in range(repeats):
                for profile, second, out in ((None, other, two), (None, None, one),
                                             (decay, other, decayed)):  # fmt: skip
                    start = time.perf_counter()
                    res = recompute(client, conn, s, profile, second)
                    out.append({**res.to_dict(), "total_s": time.perf_counter() - start})
    finally:
        client.close()
    return two, one, decayed


def poller(redis_url: str, ids: list[str], links: list[str], q: Any, stop: Any) -> None:
    """Second process: load_view in a loop; report (version, wall time first seen)."""
    client = redis.Redis.from_url(redis_url)
    store = RedisStore(client)
    seen, calls = None, []
    while not stop.is_set():
        t = time.perf_counter()
        view = store.load_view(ids, links)
        calls.append(time.perf_counter() - t)
        if view.version != seen:
            seen = view.version
            q.put(("seen", view.version, time.time()))
    q.put(("calls", statistics.median(calls), len(calls)))
    client.close()


def adoption(redis_url: str, samples: int, candidates: int) -> dict[str, Any]:
    client = redis.Redis.from_url(redis_url)
    meta = epochs.snapshot_meta(client)
    assert meta is not None, "run a recompute first"
    ids = [f"cand-{c}" for c in range(candidates)]
    links = [f"eu->{z}" for z in ZONES]
    store = RedisStore(client)
    view = store.load_view(ids, links)
    seal = epochs.Seal(meta["epoch"], meta["watermark"], 0, False)
    ctx = mp.get_context("spawn")
    q, stop = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=poller, args=(redis_url, ids, links, q, stop))
    proc.start()
    assert q.get(timeout=30)[1] == meta["version"]
    lat: list[float] = []
    publish: list[float] = []
    visible: list[float] = []
    for k in range(samples):
        version = 1_000_000 + k
        snap = epochs.Snapshot(version, seal, view.candidates, view.links, {"bench": True})
        started = time.time()
        epochs.publish(client, snap, 600.0)
        done = time.time()
        publish.append(done - started)
        kind, got, at = q.get(timeout=30)
        assert kind == "seen" and got == version, (kind, got)
        lat.append(at - started)
        visible.append(max(0.0, at - done))
        time.sleep(0.01)
    stop.set()
    _, load_p50, n_calls = q.get(timeout=30)
    proc.join(10)
    client.close()
    return {
        "samples": samples,
        "p50_ms": 1000 * statistics.median(lat),
        "p95_ms": 1000 * lower(lat, 95),
        "max_ms": 1000 * max(lat),
        "publish_p50_ms": 1000 * statistics.median(publish),
        "seen_after_publish_p50_ms": 1000 * statistics.median(visible),
        "load_view_p50_ms": 1000 * load_p50,
        "load_view_calls": n_calls,
        "candidates": candidates,
    }


def fmt(xs: list[float]) -> str:
    return ", ".join(f"{x:.3f}" for x in xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--candidates", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/9")
    args = ap.parse_args()
    err = Console(stderr=True)
    with scratch_database(args.pg_url, "haco_bench_recompute") as url:
        r = redis.Redis.from_url(args.redis_url)
        r.flushdb()
        try:
            err.print(f"loading {args.rows} member rows into {url.rsplit('/', 1)[1]} …")
            watermark, copy_s = load(url, args.rows, args.candidates)
            by_obs = ProfileSettings(half_life=1000.0, decay_unit=DecayUnit.OBSERVATIONS)
            agg = time_aggregate(url, watermark, ProfileSettings(), args.repeats)
            by_s = ProfileSettings(half_life=3600.0, decay_unit=DecayUnit.SECONDS)
            agg_decay = time_aggregate(url, watermark, by_obs, args.repeats)
            agg_decay_s = time_aggregate(url, watermark, by_s, args.repeats)
            cofail = time_cofailure(url, watermark, ProfileSettings(), args.repeats)
            whole, whole_one, whole_decay = time_recompute(
                url, args.redis_url, args.repeats, by_obs
            )
            adopt = adoption(args.redis_url, args.samples, args.candidates)
            peaks = {
                "aggregate_mb": read_peak_mb(url, watermark, ProfileSettings(), "profiles"),
                "aggregate_decay_obs_mb": read_peak_mb(url, watermark, by_obs, "profiles"),
                "cofailure_mb": read_peak_mb(url, watermark, ProfileSettings(), "cofailure"),
            }
        finally:
            r.flushdb()
            r.close()
    result = {
        "rows": args.rows,
        "candidates": args.candidates,
        "copy_s": copy_s,
        "aggregate_s": {"runs": agg, "median": statistics.median(agg)},
        "aggregate_decay_obs_s": {"runs": agg_decay, "median": statistics.median(agg_decay)},
        "aggregate_decay_seconds_s": {
            "runs": agg_decay_s,
            "median": statistics.median(agg_decay_s),
        },
        "cofailure_s": {"runs": cofail, "median": statistics.median(cofail)},
        "recompute_s": {
            "runs": [w["total_s"] for w in whole],
            "median": statistics.median(w["total_s"] for w in whole),
            "last": whole[-1],
        },
        "recompute_one_connection_s": {
            "runs": [w["total_s"] for w in whole_one],
            "median": statistics.median(w["total_s"] for w in whole_one),
        },
        "recompute_decay_obs_s": {
            "runs": [w["total_s"] for w in whole_decay],
            "median": statistics.median(w["total_s"] for w in whole_decay),
        },
        "adoption": adopt,
        "peak_memory": peaks,
        "goal_recompute_s": 2.0,
    }
    t = Table(
        title=f"profile recompute over {args.rows:,} member rows ({args.candidates} candidates)"
    )
    t.add_column("measure")
    t.add_column("median", justify="right")
    t.add_column("runs", justify="right")
    t.add_row("aggregation SQL, no decay (s)", f"{result['aggregate_s']['median']:.3f}", fmt(agg))
    t.add_row("aggregation SQL, decay by observations (s)",
              f"{result['aggregate_decay_obs_s']['median']:.3f}", fmt(agg_decay))  # fmt: skip
    t.add_row("aggregation SQL, decay by seconds (s)",
              f"{result['aggregate_decay_seconds_s']['median']:.3f}", fmt(agg_decay_s))  # fmt: skip
    t.add_row("co-failure evidence, no decay (s: SQL and fold)",
              f"{result['cofailure_s']['median']:.3f}", fmt(cofail))  # fmt: skip
    t.add_row("whole recompute (s, goal ≤ 2)", f"{result['recompute_s']['median']:.3f}",
              fmt(result["recompute_s"]["runs"]))  # fmt: skip
    one = result["recompute_one_connection_s"]
    t.add_row("  the same, both reads on one connection (s)", f"{one['median']:.3f}",
              fmt(one["runs"]))  # fmt: skip
    dec = result["recompute_decay_obs_s"]
    t.add_row("  the same, decay by observations (s)", f"{dec['median']:.3f}", fmt(dec["runs"]))
    t.add_row("peak memory a read adds: profiles, decayed, co-failure (MB)",
              " / ".join(f"{v:.0f}" for v in peaks.values()), "fresh processes")  # fmt: skip
    t.add_row("snapshot adoption by a 2nd process p50 / p95 (ms)",
              f"{adopt['p50_ms']:.2f} / {adopt['p95_ms']:.2f}",
              f"{adopt['samples']} samples")  # fmt: skip
    t.add_row("  of which publish (encode + MULTI) p50 (ms)", f"{adopt['publish_p50_ms']:.2f}", "")
    t.add_row("  seen after the publish returned p50 (ms)",
              f"{adopt['seen_after_publish_p50_ms']:.2f}", "")  # fmt: skip
    t.add_row(
        "load_view p50 (ms)", f"{adopt['load_view_p50_ms']:.3f}", str(adopt["load_view_calls"])
    )
    err.print(t)
    print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
