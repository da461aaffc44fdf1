"""What every bench records about the machine it ran on, and the CPU it reads: the
cores, the load and this VM's Python speed before and after a run (runs are compared
knowing them), a Redis server's version and ``hz``, and CPU seconds: of a process, of every
process of a name (Postgres's), of Redis and of the whole machine."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

import redis

_TICK = os.sysconf("SC_CLK_TCK")


def _stat(proc_dir: Path) -> tuple[str, float] | None:
    """A process's name (``comm``) and user + system CPU seconds (all its threads) from
    its /proc stat; None once it is gone."""
    try:
        head, rest = (proc_dir / "stat").read_text().rsplit(")", 1)
    except OSError:
        return None
    fields = rest.split()
    return head.split("(", 1)[1], (int(fields[11]) + int(fields[12])) / _TICK


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads), from /proc."""
    stat = _stat(Path(f"/proc/{pid}"))
    return float("nan") if stat is None else stat[1]


def named_cpu_s(name: str) -> float | None:
    """User + system CPU seconds of every live process named ``name`` (its ``comm``), or
    None when none runs here. For a server of one process per connection, ``postgres``:
    a process that exits between two readings takes its seconds along, so read while the
    connections being measured are open."""
    stats = (_stat(entry) for entry in Path("/proc").iterdir() if entry.name.isdigit())
    seconds = [stat[1] for stat in stats if stat is not None and stat[0] == name]
    return sum(seconds) if seconds else None


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy since boot, over all its cores: user,
    nice, system, irq and softirq of /proc/stat (not idle, I/O wait or a neighbour's steal)."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = f.readline().split()
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[1:8])
    return (user + nice + system + irq + softirq) / _TICK


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
