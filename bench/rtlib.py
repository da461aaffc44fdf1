"""Plumbing of bench/runtime.py: the services it starts, the timestamps it takes around
the coordinator, the trace stream it reads back, and small statistics helpers.

Nothing here changes the runtime: the coordinator's store, dispatcher and delay window
are replaced by subclasses that call the originals and note the time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import redis

from bench.machine import after, machine, proc_cpu_s, redis_cpu_s
from bench.pinning import Pinning, pin_caller, pinned
from coordinator.config import HacoSettings
from coordinator.core.percentiles import interpolated
from coordinator.runtime.client import HacoClient
from coordinator.runtime.dispatch import CeleryDispatcher
from coordinator.runtime.liveness import parse_started
from coordinator.runtime.pool import load_pool
from coordinator.services.embedded_redis import EmbeddedRedis
from coordinator.services.supervisor import Stack
from coordinator.state import keys
from coordinator.state.broker import with_db
from coordinator.state.closing import CloseLimits, GroupClose, GroupClosed
from coordinator.state.hedgedelay import RedisDelayWindow
from coordinator.state.opening import GroupOpening
from coordinator.state.store import RedisStore
from schemas.models import MemberTask

BENCH = Path(__file__).resolve().parent
POOL_FILE = BENCH / "fixtures" / "runtime_pool.toml"
ZONE = "local"
ZONE2 = "local2"  # the second zone: the "two-zones" role's second member, its own worker
STOP_TIMEOUT_S = 10.0
READY_TIMEOUT_S = 60.0
ECHO_IN, ECHO_OUT = "bench:echo:in", "bench:echo:out"
ECHO_IDLE_S = 30  # the echo peer exits after this long without a message


# ---------------------------------------------------------------- statistics


def summary_ms(values_s: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/mean/max in milliseconds of values in seconds."""
    p50, p90, p99 = interpolated(values_s, 50, 90, 99)
    arr = np.asarray(values_s, dtype=float) if values_s else np.array([np.nan])
    return {
        "n": len(values_s),
        "p50_ms": p50 * 1e3,
        "p90_ms": p90 * 1e3,
        "p99_ms": p99 * 1e3,
        "mean_ms": float(arr.mean()) * 1e3,
        "max_ms": float(arr.max()) * 1e3,
    }


def run_on_redis(
    module: str,
    doc: str,
    defaults: tuple[int, int],
    run: Callable[[str, int, int], Any],
) -> tuple[dict[str, Any], argparse.Namespace]:
    """A one-process Redis bench's command line (``--n``, ``--rounds``, ``--json``) and
    its server (HACO_REDIS_URL, else an embedded one in a temporary directory, stopped
    after): ``run(url, n, rounds)``'s JSON stamped with the command, the machine and
    where Redis came from, and the parsed arguments. ``defaults``: --n and --rounds."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--n", type=int, default=defaults[0], help="calls per round and case")
    parser.add_argument("--rounds", type=int, default=defaults[1])
    parser.add_argument("--json", type=Path, help="also write the JSON here")
    argv = sys.argv[1:]
    args = parser.parse_args(argv)
    if args.n < 1 or args.rounds < 1:
        parser.error(f"--n and --rounds must be >= 1, got {args.n} and {args.rounds}")
    given, before = os.environ.get("HACO_REDIS_URL"), machine()
    with tempfile.TemporaryDirectory(prefix="haco-bench-") as tmp:
        embedded = None if given else EmbeddedRedis(Path(tmp) / "state")
        try:
            url = embedded.start() if embedded is not None else str(given)
            res = dict(run(url, args.n, args.rounds))
        finally:
            if embedded is not None:
                embedded.stop()
    res["command"] = " ".join([f"python -m {module}", *argv])
    res["machine"] = after(before)
    res["redis"]["source"] = "HACO_REDIS_URL" if given else "embedded"
    return res, args


# ---------------------------------------------------------------- services


@dataclass
class BenchStack(Stack):
    """A Stack whose workers also get the bench's HACO_* variables."""

    extra_env: dict[str, str] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        return {**super().env(), **self.extra_env}


class Services:
    """Redis (HACO_REDIS_URL, else embedded in ``tmp``), HACO workers and the bare worker.

    :meth:`stop_workers` stops every worker (bare first, then HACO's), :meth:`close`
    also stops an embedded server, after the workers.
    """

    def __init__(
        self,
        tmp: Path,
        concurrency: int,
        bare_events: bool = False,
        lane: bool = True,
        pin: Pinning | None = None,
    ) -> None:
        self.tmp = tmp
        self.pin = pin  # each spawned process born on its role's CPUs (bench.pinning)
        self.concurrency = concurrency
        self.bare_events = bare_events
        # HACO's workers run members in the member lane (workers/lane.py, the default),
        # else through Celery's consumer.
        self.lane = lane
        self.embedded: EmbeddedRedis | None = None
        url = os.environ.get("HACO_REDIS_URL")
        if not url:
            self.embedded = EmbeddedRedis(tmp / "state")
            with pinned(pin, "redis"):
                url = self.embedded.start()
        self.url = url
        pin_caller(pin)  # after the server's spawn: it is born on its own CPUs
        self.stack = self._stack()
        self.bare: subprocess.Popen[bytes] | None = None
        self.app_redis = redis.Redis.from_url(with_db(url, keys.APP_DB))

    def _stack(self) -> BenchStack:
        env = {"HACO_POOL_FILE": str(POOL_FILE), "HACO_SIM_TIME_SCALE": "1.0"}
        env["HACO_STATE_DIR"] = str(self.tmp / "state")
        env["HACO_MEMBER_LANE"] = "true" if self.lane else "false"
        return BenchStack(self.url, None, log_dir=self.tmp / "logs", extra_env=env)

    def flush(self) -> None:
        """Empty the app DB and the broker DB: call with no worker running."""
        for db in (keys.APP_DB, keys.BROKER_DB):
            with redis.Redis.from_url(with_db(self.url, db)) as r:
                r.flushdb()

    def start_haco(self, zones: Sequence[str] = (ZONE,)) -> None:
        """A HACO worker for each of ``zones``."""
        for zone in zones:
            with pinned(self.pin, "workers"):
                self.stack.start_worker(zone, self.concurrency)

    def start_bare(self) -> None:
        cmd = [sys.executable, "-m", "bench.bare_celery", "worker", "--url", self.url]
        cmd += ["--concurrency", str(self.concurrency)] + (["--events"] if self.bare_events else [])
        log_dir = self.tmp / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        with (log_dir / "worker-bare.log").open("ab") as log, pinned(self.pin, "workers"):
            self.bare = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

    def stop_workers(self) -> None:
        if self.bare is not None:
            if self.bare.poll() is None:
                self.bare.send_signal(signal.SIGTERM)
            try:
                self.bare.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.bare.kill()
                self.bare.wait()
            self.bare = None
        self.stack.stop()  # its embedded is None: workers only

    def close(self) -> None:
        try:
            self.stop_workers()
        finally:
            self.app_redis.close()
            if self.embedded is not None:
                self.embedded.stop()
                self.embedded = None

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of this process, each worker and the Redis server."""
        t = os.times()
        out = {"client": t.user + t.system, "redis": redis_cpu_s(self.app_redis)}
        for zone, proc in self.stack.workers.items():
            out[f"worker_{zone}"] = proc_cpu_s(proc.pid)
        if self.bare is not None:
            out["worker_bare"] = proc_cpu_s(self.bare.pid)
        return out

    def log_tail(self, name: str, chars: int = 1500) -> str:
        with contextlib.suppress(OSError):
            return (self.tmp / "logs" / f"worker-{name}.log").read_text("utf-8", "replace")[-chars:]
        return ""


# ---------------------------------------------------------------- the coordinator, timed


class Marks:
    """Times (time.time, comparable with the workers' traces) noted around the coordinator."""

    def __init__(self) -> None:
        self.sent: dict[str, dict[int, tuple[float, float]]] = defaultdict(dict)
        self.woke: dict[str, float] = {}  # first reply popped
        self.cancelled: dict[str, float] = {}  # just before the state SET
        self.delays: list[float] = []
        self.local = threading.local()  # the delay of the current thread's group


class TimedStore(RedisStore):
    def __init__(self, client: redis.Redis, marks: Marks) -> None:
        super().__init__(client)
        self.marks = marks

    def pop_reply(self, group_id: str, timeout_s: float) -> str | None:
        raw = super().pop_reply(group_id, timeout_s)
        if raw is not None and parse_started(raw) is None:  # a report, not a start signal
            self.marks.woke.setdefault(group_id, time.time())
        return raw

    def pop_replies(self, group_id: str, timeout_s: float, max_n: int) -> list[str]:
        got = super().pop_replies(group_id, timeout_s, max_n)
        if any(parse_started(raw) is None for raw in got):  # a report, not only start signals
            self.marks.woke.setdefault(group_id, time.time())
        return got

    def close_group(self, close: GroupClose, limits: CloseLimits) -> GroupClosed:
        # The moment the coordinator sends the group's final state (the losers' cancel).
        self.marks.cancelled[close.group_id] = time.time()
        return super().close_group(close, limits)


class TimedDispatcher(CeleryDispatcher):
    def __init__(self, app: Any, zones: frozenset[str], marks: Marks) -> None:
        super().__init__(app, zones, app_db=keys.APP_DB)
        self.marks = marks

    def send(self, zone: str, task: MemberTask) -> None:
        t0 = time.time()
        super().send(zone, task)
        self.marks.sent[task.group_id][task.rank] = (t0, time.time())

    def send_many(
        self, items: Sequence[tuple[str, MemberTask]], opening: GroupOpening | None = None
    ) -> None:
        # One round trip for the batch: each of its members was sent between its ends.
        t0 = time.time()
        super().send_many(items, opening)
        t1 = time.time()
        for _, task in items:
            self.marks.sent[task.group_id][task.rank] = (t0, t1)


class TimedDelays(RedisDelayWindow):
    def __init__(self, client: redis.Redis, settings: HacoSettings, marks: Marks) -> None:
        super().__init__(client, settings)
        self.marks = marks

    def delay_s(self, role: str) -> float:
        d = super().delay_s(role)
        self.marks.delays.append(d)
        self.marks.local.delay = d
        return d


def bench_client(url: str, **settings: Any) -> HacoClient:
    """A HacoClient on the bench pool (its settings: ``client.settings``)."""
    s = HacoSettings(redis_url=url, pool_file=POOL_FILE, sim_time_scale=1.0, **settings)
    return HacoClient(s, pool=load_pool(POOL_FILE), redis_url=url)


def timed_client(url: str, **settings: Any) -> tuple[HacoClient, Marks]:
    """A :func:`bench_client` whose coordinator notes its timings in Marks."""
    client = bench_client(url, **settings)
    marks = Marks()
    coord = client.coordinator
    coord.store = TimedStore(client.redis, marks)
    coord.dispatcher = TimedDispatcher(client.app, client.pool.zones, marks)
    coord.delays = TimedDelays(client.redis, client.settings, marks)
    return client, marks


# ---------------------------------------------------------------- traces


Entries = list[tuple[bytes, dict[bytes, bytes]]]


def _xrange(r: redis.Redis, start: str, end: str, count: int) -> Entries:
    return cast(Entries, r.xrange(keys.TRACES, min=start, max=end, count=count))


def _after(entry_id: bytes) -> str:
    ms, seq = entry_id.decode().split("-")
    return f"{ms}-{int(seq) + 1}"


def _stream_values(r: redis.Redis, since_ms: int, field: str) -> Iterator[dict[str, Any]]:
    """The JSON of ``field`` in every stream entry that has it (XADD time >= since_ms)."""
    start, name = f"{since_ms}-0", field.encode()
    while True:
        batch = _xrange(r, start, "+", 2000)
        for _, fields in batch:
            if (value := fields.get(name)) is not None:
                yield json.loads(value)
        if len(batch) < 2000:
            return
        start = _after(batch[-1][0])


def read_traces(r: redis.Redis, since_ms: int = 0) -> dict[str, list[dict[str, Any]]]:
    """Every member trace of the stream (XADD time >= since_ms), grouped by group id."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for report in _stream_values(r, since_ms, keys.REPORT_FIELD):
        out[report["trace"]["group_id"]].append(report["trace"])
    return out


def read_verdicts(r: redis.Redis, since_ms: int = 0) -> dict[str, dict[str, Any]]:
    """Every group verdict of the stream (XADD time >= since_ms), by group id."""
    return {v["group_id"]: v for v in _stream_values(r, since_ms, keys.VERDICT_FIELD)}


def count_stream(r: redis.Redis, t0: float, t1: float) -> int:
    """Members that finished (appended their trace) between t0 and t1 (epoch seconds).

    Only member traces count: the stream also holds one verdict entry per closed group
    (keys.VERDICT_FIELD), which would add the groups/s to the member tasks/s."""
    n = 0
    start, end = f"{int(t0 * 1000)}-0", f"{int(t1 * 1000)}-0"
    report = keys.REPORT_FIELD.encode()
    while True:
        batch = _xrange(r, start, end, 5000)
        n += sum(1 for _, fields in batch if report in fields)
        if len(batch) < 5000:
            return n
        start = _after(batch[-1][0])


def own_latency(trace: dict[str, Any]) -> float:
    return float(trace["finished_at_s"]) - float(trace["started_at_s"])


# ---------------------------------------------------------------- the floor


def echo_peer(url: str) -> None:
    """The other process of the floor: BRPOP a message, LPUSH it back, until 'stop'."""
    r = redis.Redis.from_url(with_db(url, keys.APP_DB))
    while True:
        got = r.brpop([ECHO_IN], timeout=ECHO_IDLE_S)
        if got is None or got[1] == b"stop":
            return
        r.lpush(ECHO_OUT, got[1])


def echo_floor(url: str, n: int, warmup: int = 50) -> list[float]:
    """Round trips (s) of LPUSH → peer BRPOP → peer LPUSH → BRPOP between two processes."""
    cmd = [sys.executable, "-m", "bench.runtime", "echo-peer", "--url", url]
    peer = subprocess.Popen(cmd)
    r = redis.Redis.from_url(with_db(url, keys.APP_DB))
    out: list[float] = []
    try:
        for i in range(warmup + n):
            t0 = time.perf_counter()
            r.lpush(ECHO_IN, b"x")
            if r.brpop([ECHO_OUT], timeout=READY_TIMEOUT_S) is None:
                raise RuntimeError("the echo peer did not answer")
            if i >= warmup:
                out.append(time.perf_counter() - t0)
    finally:
        r.lpush(ECHO_IN, b"stop")
        try:
            peer.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            peer.kill()
            peer.wait()
        r.close()
    return out
