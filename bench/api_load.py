"""`haco serve` under load, against an OpenAI-protocol backend in this process (an async
Starlette app on uvicorn: role ``fast`` streams at once, role ``slow`` answers after
``--hold-s``), each role one ``kind = "openai"`` candidate.

1. Time to first chunk: ``--n`` sequential streamed requests (``stream: true``,
   ``winner_mode`` first) through `haco serve` against the same request streamed directly
   to the backend, interleaved call by call.
2. ``--load`` concurrent POST /v1/chat/completions of role ``slow`` (one httpx.AsyncClient,
   a connection limit above ``--load``; `haco serve` with HACO_START_TIMEOUT_MIN_S =
   ``--start-timeout-s``, as the one worker starts the burst's members over seconds):
   completed, errors, the backend's peak in-flight
   calls, the serve process's Redis connections (its sockets to the Redis port, from /proc)
   and its resident memory over the idle baseline, per in-flight invocation.

    python -m bench.api_load [--n 200] [--load 2000] [--hold-s 5] [--concurrency 2100]
        [--start-timeout-s 60]

`haco serve` runs as a subprocess (its RSS is its own); Redis from HACO_REDIS_URL, else
embedded in a temp dir; one `haco worker` subprocess with ``--concurrency`` threads.
JSON on stdout, a table on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
from rich.table import Table

from bench.api import free_port
from bench.console import show
from bench.machine import machine
from bench.openai_backend import START_TIMEOUT_S, Backend
from bench.rtlib import BenchStack, Services, summary_ms

ZONE = "local"
KEY_ENV = "HACO_BENCH_KEY"
WARMUP = 10
DEADLINE_S = 60.0
PAGE = os.sysconf("SC_PAGE_SIZE")


def write_pool(folder: Path, backend: Backend) -> Path:
    text = f'caller_zone = "{ZONE}"\nzones = ["{ZONE}"]\n'
    for role in ("fast", "slow"):
        text += f"""
[[candidates]]
id = "{role}-1"
role = "{role}"
model = "{role}"
zone = "{ZONE}"
[candidates.backend]
kind = "openai"
[candidates.backend.settings]
base_url = "{backend.url}/v1"
api_key_env = "{KEY_ENV}"
read_timeout_s = 30.0
"""
    path = folder / "pool.toml"
    path.write_text(text, encoding="utf-8")
    return path


class LoadServices(Services):
    """Services whose workers read this bench's pool (and its API key)."""

    def __init__(self, tmp: Path, concurrency: int, pool: Path) -> None:
        self.pool = pool
        super().__init__(tmp, concurrency)

    def _stack(self) -> BenchStack:
        env = {"HACO_POOL_FILE": str(self.pool), KEY_ENV: "sk-bench"}
        # every worker thread may hold a Redis and a backend connection at once
        conns = str(self.concurrency + 100)
        env["HACO_WORKER_REDIS_CONNECTIONS"] = env["HACO_HTTP_MAX_CONNECTIONS"] = conns
        env["HACO_STATE_DIR"] = str(self.tmp / "state")
        return BenchStack(self.url, None, log_dir=self.tmp / "logs", extra_env=env)


class Serve:
    """`haco serve` in a subprocess on a free port."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        exe = Path(sys.executable).with_name("haco")
        cmd = [str(exe), "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        self.log = log.open("ab")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self) -> None:
        end = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"haco serve exited {self.proc.returncode}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("haco serve did not start")

    def rss(self) -> int:
        with open(f"/proc/{self.proc.pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE

    def redis_conns(self, port: int) -> int:
        """The process's TCP sockets whose remote port is ``port`` (/proc: its fds' socket
        inodes against the namespace's tcp tables)."""
        inodes = set()
        fd_dir = Path(f"/proc/{self.proc.pid}/fd")
        for fd in fd_dir.iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        count = 0
        for table in ("tcp", "tcp6"):
            lines = Path(f"/proc/{self.proc.pid}/net/{table}").read_text().splitlines()[1:]
            for line in lines:
                cols = line.split()
                if int(cols[2].rsplit(":", 1)[1], 16) == port and cols[9] in inodes:
                    count += 1
        return count

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def first_chunk_s(http: httpx.Client, url: str, body: dict[str, Any]) -> float:
    t0 = time.perf_counter()
    first = 0.0
    with http.stream("POST", url, json=body) as res:
        if res.status_code != 200:
            raise RuntimeError(f"HTTP {res.status_code}: {res.read()!r}")
        for line in res.iter_lines():
            if line.startswith("data: ") and '"content"' in line and not first:
                first = time.perf_counter() - t0
    if not first:
        raise RuntimeError(f"no content chunk from {url}")
    return first


def ttft(serve: Serve, backend: Backend, n: int) -> dict[str, list[float]]:
    msgs = [{"role": "user", "content": "x"}]
    via: dict[str, Any] = {"model": "fast", "stream": True, "messages": msgs}
    via["haco"] = {"winner_mode": "first", "deadline_s": DEADLINE_S}
    direct: dict[str, Any] = {"model": "fast", "stream": True, "messages": msgs}
    direct["stream_options"] = {"include_usage": True}
    out: dict[str, list[float]] = {"haco": [], "direct": []}
    with httpx.Client(timeout=DEADLINE_S) as http:
        for i in range(n + WARMUP):
            a = first_chunk_s(http, f"{serve.url}/v1/chat/completions", via)
            b = first_chunk_s(http, f"{backend.url}/v1/chat/completions", direct)
            if i >= WARMUP:
                out["haco"].append(a)
                out["direct"].append(b)
    return out


async def load(serve: Serve, backend: Backend, n: int, redis_port: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "slow", "messages": [{"role": "user", "content": "x"}]}
    body["haco"] = {"deadline_s": DEADLINE_S}
    limits = httpx.Limits(max_connections=n + 100, max_keepalive_connections=n + 100)
    base_rss = serve.rss()
    base_conns = serve.redis_conns(redis_port)
    peak = {"rss": base_rss, "conns": base_conns, "backend_inflight": 0, "open": 0}
    open_now = [0]
    done = asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            peak["rss"] = max(peak["rss"], serve.rss())
            peak["conns"] = max(peak["conns"], serve.redis_conns(redis_port))
            peak["backend_inflight"] = max(peak["backend_inflight"], backend.inflight)
            peak["open"] = max(peak["open"], open_now[0])
            await asyncio.sleep(0.1)

    errors: dict[str, int] = {}
    first_error: list[str] = []

    async def one(http: httpx.AsyncClient) -> float | None:
        t0 = time.perf_counter()
        open_now[0] += 1
        try:
            res = await http.post("/v1/chat/completions", json=body)
        except httpx.HTTPError as exc:
            errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            return None
        finally:
            open_now[0] -= 1
        if res.status_code != 200:
            errors[f"HTTP {res.status_code}"] = errors.get(f"HTTP {res.status_code}", 0) + 1
            if not first_error:
                first_error.append(res.text[:500])
            return None
        return time.perf_counter() - t0

    async with httpx.AsyncClient(base_url=serve.url, limits=limits, timeout=DEADLINE_S * 2) as http:
        sampler = asyncio.create_task(sample())
        t0 = time.perf_counter()
        lat = await asyncio.gather(*(one(http) for _ in range(n)))
        wall = time.perf_counter() - t0
        done.set()
        await sampler
    ok = [x for x in lat if x is not None]
    after = serve.rss()
    return {
        "n": n,
        "hold_s": backend.hold_s,
        "completed": len(ok),
        "errors": errors,
        "first_error": first_error[0] if first_error else None,
        "wall_s": wall,
        "latency": summary_ms(ok) if ok else {},
        "backend_peak_inflight": peak["backend_inflight"],
        "requests_peak_open": peak["open"],
        "serve_redis_conns_idle": base_conns,
        "serve_redis_conns_peak": peak["conns"],
        "serve_rss_idle_mib": base_rss / 2**20,
        "serve_rss_peak_mib": peak["rss"] / 2**20,
        "serve_rss_after_mib": after / 2**20,
        "rss_per_inflight_kib": (peak["rss"] - base_rss) / 1024 / n,
    }


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # inherited by the subprocesses
    with Backend(args.hold_s) as backend:
        svc = LoadServices(tmp, args.concurrency, write_pool(tmp, backend))
        serve: Serve | None = None
        try:
            svc.start_haco()
            env = {**os.environ, **svc.stack.env()}
            env["HACO_START_TIMEOUT_MIN_S"] = str(args.start_timeout_s)
            serve = Serve(env, tmp / "serve.log")
            serve.wait_ready()
            redis_port = urlparse(svc.url).port or 6379
            times = ttft(serve, backend, args.n)
            res = asyncio.run(load(serve, backend, args.load, redis_port))
        finally:
            if serve is not None:
                serve.close()
            svc.close()
    via, direct = summary_ms(times["haco"]), summary_ms(times["direct"])
    keys = ("p50_ms", "p90_ms", "p99_ms", "mean_ms")
    return {
        "machine": machine(),
        "worker_concurrency": args.concurrency,
        "start_timeout_min_s": args.start_timeout_s,
        "ttft": {
            "n": args.n,
            "haco": via,
            "direct": direct,
            "haco_minus_direct": {k: via[k] - direct[k] for k in keys},
        },
        "load": res,
    }


def table(res: dict[str, Any]) -> Table:
    t = Table(title="haco serve: time to first chunk, ms, and concurrent load")
    for c in ("measure", "p50", "p99", "other"):
        t.add_column(c, justify="left" if c == "measure" else "right")
    tt = res["ttft"]
    for name, key in (("TTFC via haco serve", "haco"), ("TTFC direct", "direct"),
                      ("difference", "haco_minus_direct")):  # fmt: skip
        s = tt[key]
        t.add_row(name, f"{s['p50_ms']:.2f}", f"{s['p99_ms']:.2f}", f"n={tt['n']}")
    ld = res["load"]
    lat = ld["latency"]
    t.add_row(
        f"{ld['n']} concurrent (hold {ld['hold_s']} s)",
        f"{lat.get('p50_ms', 0.0):.0f}",
        f"{lat.get('p99_ms', 0.0):.0f}",
        f"completed {ld['completed']}, errors {sum(ld['errors'].values())}, "
        f"peak open {ld['requests_peak_open']}, "
        f"backend peak in flight {ld['backend_peak_inflight']}",
    )
    t.add_row(
        "serve Redis conns / RSS",
        "",
        "",
        f"conns {ld['serve_redis_conns_idle']} idle → {ld['serve_redis_conns_peak']} peak; "
        f"RSS {ld['serve_rss_idle_mib']:.0f} → {ld['serve_rss_peak_mib']:.0f} MiB, "
        f"{ld['rss_per_inflight_kib']:.1f} KiB per in-flight invocation",
    )
    return t


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.api_load", description=__doc__)
    parser.add_argument("--n", type=int, default=200, help="sequential streamed calls per path")
    parser.add_argument("--load", type=int, default=2000, help="concurrent invocations")
    parser.add_argument("--hold-s", type=float, default=5.0, help="the slow backend's delay")
    parser.add_argument("--concurrency", type=int, default=2100, help="worker threads")
    parser.add_argument(
        "--start-timeout-s",
        type=float,
        default=60.0,
        help="HACO_START_TIMEOUT_MIN_S of haco serve (the default 2 s fails members still "
        "queued behind a burst of 2,000)",
    )
    args = parser.parse_args(argv)
    if args.n < 1 or args.load < 1 or args.concurrency < 1:
        parser.error("--n, --load and --concurrency must be positive")
    with tempfile.TemporaryDirectory(prefix="haco-bench-api-load-") as tmp:
        res = run(args, Path(tmp))
    show(table(res))
    json.dump(res, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
