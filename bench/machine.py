"""What every bench records about the machine it ran on, and the CPU it reads: the
cores, the load and this VM's Python speed before and after a run (runs are compared
knowing them), a Redis server's version and ``hz``, a process's and Redis's CPU seconds."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

import redis

_TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / _TICK


def redis_cpu_s(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def server_info(r: redis.Redis) -> dict[str, Any]:
    """Version and hz of the Redis server: hz bounds how late a BRPOP timeout fires."""
    info = r.info("server")
    out: dict[str, Any] = {"version": info.get("valkey_version") or info.get("redis_version")}
    with contextlib.suppress(redis.RedisError):
        out["hz"] = int(str(r.config_get("hz").get("hz", 0)))
    return out


def python_loop_ms(n: int = 1_000_000, tries: int = 3) -> float:
    """The fastest of ``tries`` pure-Python loops of ``n`` additions, ms: this VM's
    Python speed at the moment. It moves between runs (a neighbour's load, the host's
    clock) by 40% on the project's machine, and every figure of the hot path is mostly
    Python: runs are compared knowing it."""
    best = float("inf")
    for _ in range(tries):
        t0, total = time.perf_counter(), 0
        for i in range(n):
            total += i
        best = min(best, time.perf_counter() - t0)
    return round(best * 1e3, 1)


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "loadavg": list(os.getloadavg()),
        "python_loop_ms": python_loop_ms(),
        "python": sys.version.split()[0],
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def after(before: dict[str, Any]) -> dict[str, Any]:
    """``before`` (a :func:`machine`) with the load and the Python speed at the end."""
    speed = python_loop_ms()
    return {**before, "loadavg_after": list(os.getloadavg()), "python_loop_ms_after": speed}
