"""A Redis round trip after the client has been idle: back to back, then after pauses.

    python -m bench.idlewake [--n 400] [--rounds 3] [--json PATH]

One process, one thread, one connection to the server (HACO_REDIS_URL, else an embedded
one in a temporary directory): a PING timed on its own after a pause of 0, 1, 5 and
20 ms (``time.sleep``), the pauses interleaved call by call so every case sees the same
machine. Why it exists: a call in the tail bench waits for its backend's draw (5 ms
median) with the client, the worker and Redis all idle, and each of them then wakes from
the CPU's idle state on the next message. Its round trips cost more than the same trips
back to back (the overhead bench, ~0 s backend); this bench gives that cost on its own,
for HACO and bare Celery alike, since it is the machine's, not either system's.
"""

from __future__ import annotations

import time
from typing import Any

import redis
from rich.table import Table

from bench.console import emit
from bench.machine import server_info
from bench.rtlib import run_on_redis
from coordinator.core.percentiles import interpolated, median
from coordinator.state.lean import LeanRedis

PAUSES_MS = (0.0, 1.0, 5.0, 20.0)
QUANTILES = (50.0, 90.0, 99.0)


def run(url: str, n: int, rounds: int) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    lean = LeanRedis(client)
    info = server_info(client)
    rtt_ms: dict[float, list[float]] = {p: [] for p in PAUSES_MS}
    per_round: dict[float, list[float]] = {p: [] for p in PAUSES_MS}
    try:
        lean.execute("PING")  # connected
        for _ in range(rounds):
            this_round: dict[float, list[float]] = {p: [] for p in PAUSES_MS}
            for _ in range(n):
                for pause_ms in PAUSES_MS:
                    if pause_ms:
                        time.sleep(pause_ms / 1e3)
                    t0 = time.perf_counter()
                    lean.execute("PING")
                    this_round[pause_ms].append((time.perf_counter() - t0) * 1e3)
            for p, got in this_round.items():
                rtt_ms[p].extend(got)
                per_round[p].append(median(got))
    finally:
        lean.close()
        client.close()
    cases = {}
    for p in PAUSES_MS:
        p50, p90, p99 = interpolated(rtt_ms[p], *QUANTILES)
        ratios = [a / b for a, b in zip(per_round[p], per_round[0.0], strict=True)]
        cases[f"{p:g}"] = {
            "pause_ms": p,
            "rtt_ms": {"p50": p50, "p90": p90, "p99": p99},
            "p50_over_back_to_back": median(ratios),  # within each round, side by side
        }
    return {"n": n, "rounds": rounds, "cases": cases, "redis": info}


def main() -> None:
    res, args = run_on_redis("bench.idlewake", __doc__ or "", (400, 3), run)
    t = Table(title=f"Redis PING round trip after a pause ({args.rounds} rounds × {args.n})")
    for c in ("pause before the call", "p50 ms", "p90 ms", "p99 ms", "p50 / back to back"):
        t.add_column(c, justify="left" if c.startswith("pause") else "right")
    for case in res["cases"].values():
        q = case["rtt_ms"]
        label = f"{case['pause_ms']:g} ms" if case["pause_ms"] else "none (back to back)"
        t.add_row(label, *(f"{q[k]:.3f}" for k in ("p50", "p90", "p99")),
                  f"{case['p50_over_back_to_back']:.2f}")  # fmt: skip
    emit(res, t, args.json)


if __name__ == "__main__":
    main()
