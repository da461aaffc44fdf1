"""CPU per Redis call on the hot path: redis-py's own path against coordinator.state.lean.

    python -m bench.leancall [--n 5000] [--rounds 5] [--json PATH]

One process, one thread, the same server (HACO_REDIS_URL, else an embedded one in a
temporary directory): a PING and a script the size of a member's report (8 keys, 23
arguments), each through ``redis.Redis`` (``execute_command`` / ``register_script``) and
through :class:`~coordinator.state.lean.LeanRedis`, interleaved round by round. The
figure is process CPU time per call (client side only: packing, the socket calls,
parsing, and whatever each path adds), the median over rounds; the ratio is taken
within each round, side by side.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import redis
from rich.table import Table

from bench.console import show
from bench.machine import server_info
from bench.rtlib import run_on_redis
from coordinator.core.percentiles import median
from coordinator.state.lean import LeanRedis

SCRIPT = "return #KEYS + #ARGV"
KEYS = [f"haco:bench:lean:{i}" for i in range(8)]
ARGS = ["x" * 40] * 23  # a member report's argument count, short values


def cpu_per_call_us(call: Callable[[], Any], n: int) -> float:
    t0 = time.process_time()
    for _ in range(n):
        call()
    return (time.process_time() - t0) / n * 1e6


def run(url: str, n: int, rounds: int) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    lean = LeanRedis(client)
    script, lean_script = client.register_script(SCRIPT), lean.script(SCRIPT)
    calls: dict[str, Callable[[], Any]] = {
        "ping redis-py": client.ping,
        "ping lean": lambda: lean.execute("PING"),
        "script redis-py": lambda: script(keys=KEYS, args=ARGS),
        "script lean": lambda: lean_script(KEYS, ARGS),
    }
    info = server_info(client)
    try:
        for call in calls.values():  # connected, scripts loaded
            call()
        per: dict[str, list[float]] = {k: [] for k in calls}
        for _ in range(rounds):
            for name, call in calls.items():
                per[name].append(cpu_per_call_us(call, n))
    finally:
        lean.close()
        client.close()
    med = {k: median(v) for k, v in per.items()}
    ratio = {
        what: median(
            [lo / hi for lo, hi in zip(per[f"{what} lean"], per[f"{what} redis-py"], strict=True)]
        )
        for what in ("ping", "script")
    }
    return {
        "n": n,
        "rounds": rounds,
        "cpu_us_per_call": med,
        "lean_over_redis_py": ratio,
        "redis": info,
    }


def main() -> None:
    res, args = run_on_redis("bench.leancall", __doc__ or "", (5000, 5), run)
    t = Table(title=f"CPU per call, µs (median of {args.rounds} rounds × {args.n} calls)")
    for c in ("call", "redis-py", "lean", "lean / redis-py"):
        t.add_column(c, justify="left" if c == "call" else "right")
    for what in ("ping", "script"):
        c = res["cpu_us_per_call"]
        t.add_row(
            what,
            f"{c[f'{what} redis-py']:.1f}",
            f"{c[f'{what} lean']:.1f}",
            f"{res['lean_over_redis_py'][what]:.2f}",
        )
    show(t)
    text = json.dumps(res, indent=2)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
