"""Runtime benchmarks of HACO's distributed path (Celery workers + Redis), side by side
with their floors: a raw Redis echo between two processes and a bare Celery app.

    python -m bench.runtime overhead|throughput|tail|loser|all [--n N] [--json PATH]

Starts what it needs (Redis from HACO_REDIS_URL, else an embedded server in a temp dir;
`haco worker` subprocesses with HACO_POOL_FILE=bench/fixtures/runtime_pool.toml; the
bare worker of bench/bare_celery.py), flushes DB 0 and DB 1 before each benchmark,
stops workers before the server, prints tables on stderr and one JSON object on stdout.
Every phase is bounded; --timeout bounds the whole run.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.table import Table

from bench import rtbench, rttail
from bench.console import err, show
from bench.rtlib import Services, echo_floor, echo_peer, machine, server_info, summary_ms

BENCHES = ("overhead", "throughput", "tail", "loser")
DEFAULT_N = {"overhead": 1000, "tail": 1500, "loser": 200}
GOALS = {
    "overhead_p50_ms": 1.5,
    "overhead_p99_ms": 6.0,
    "throughput_ratio": 0.9,
    "tail_p99_over_oracle": 1.2,
    "tail_extra_load": 0.05,
    "loser_p50_ms": 10.0,
    "loser_p95_ms": 30.0,
}


class Interrupted(Exception):
    pass


def _f(x: Any, digits: int = 2) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


# ---------------------------------------------------------------- benchmarks


def run_overhead(svc: Services, args: argparse.Namespace) -> dict[str, Any]:
    n = args.n or DEFAULT_N["overhead"]
    floor = summary_ms(echo_floor(svc.url, n))
    svc.start_bare()
    svc.start_haco()
    bare = rtbench.bare_latency(svc, n)
    one = rtbench.haco_latency(svc, "one", n, {})
    two = rtbench.haco_latency(svc, "two", n, {**rtbench.HEDGED, "launch_mode": "parallel"})
    res = {"n": n, "floor_echo": floor, "bare_celery_roundtrip": bare, "haco_1": one, "haco_2": two}
    res["met"] = {
        k: v["overhead"]["p50_ms"] <= GOALS["overhead_p50_ms"]
        and v["overhead"]["p99_ms"] <= GOALS["overhead_p99_ms"]
        for k, v in (("haco_1", one), ("haco_2", two))
    }
    t = Table(title=f"dispatch overhead, ms (n={n} sequential calls; goal p50 ≤ 1.5, p99 ≤ 6)")
    for c in ("what", "p50", "p90", "p99", "max"):
        t.add_column(c, justify="left" if c == "what" else "right")

    def row(name: str, s: dict[str, Any]) -> None:
        t.add_row(name, _f(s["p50_ms"]), _f(s["p90_ms"]), _f(s["p99_ms"]), _f(s["max_ms"]))

    row("floor: Redis LPUSH→BRPOP echo, 2 processes", floor)
    row("bare Celery round trip (send_task → LPUSH → BRPOP)", bare)
    for name, r in (("1 member", one), ("2 members, parallel, first", two)):
        row(f"HACO {name}: group latency (caller)", r["group_e2e"])
        row(f"HACO {name}: overhead = group − fastest member", r["overhead"])
        row(f"HACO {name}: overhead, coordinator's latency_s", r["overhead_coordinator"])
    show(t)
    b = Table(title="where the overhead goes (fastest member), ms p50 / p99")
    b.add_column("stage")
    for name in ("1 member", "2 members"):
        b.add_column(name, justify="right")
    for stage in one["breakdown_p50_ms"]:
        b.add_row(
            stage,
            *(
                f"{r['breakdown_p50_ms'][stage]:.3f} / {r['breakdown_p99_ms'][stage]:.3f}"
                for r in (one, two)
            ),
        )
    show(b)
    return res


def run_throughput(svc: Services, args: argparse.Namespace) -> dict[str, Any]:
    res = rtbench.throughput(svc, args.clients, args.duration, args.rounds)
    res["met"] = {k: v >= GOALS["throughput_ratio"] for k, v in res["ratio_to_bare"].items()}
    t = Table(
        title=f"throughput, member tasks/s ({args.clients} client threads, "
        f"{args.rounds}×{args.duration:g} s per system, worker concurrency {svc.concurrency}; "
        "goal ≥ 90% of bare)"
    )
    cols = ("system", "tasks/s (median)", "groups/s", "vs bare", "per round")
    for c in (*cols, "CPU ms/task: client · worker · redis", "ceiling/s: worker · 2 cores"):
        t.add_column(c, justify="left" if c == "system" else "right")
    for k, v in res["median_tasks_per_s"].items():
        rounds = ", ".join(f"{x['tasks_per_s']:.0f}" for x in res["runs"][k])
        ratio = res["ratio_to_bare"].get(k)
        cpu = res["cpu_ms_per_task"][k]
        worker = cpu["worker_bare" if k == "bare" else "worker_local"]
        t.add_row(
            k,
            f"{v:.0f}",
            f"{res['median_groups_per_s'][k]:.0f}",
            "—" if ratio is None else f"{ratio:.0%}",
            rounds,
            f"{cpu['client']:.2f} · {worker:.2f} · {cpu['redis']:.2f}",
            f"{res['ceiling_tasks_per_s'][k]['worker']:.0f} · "
            f"{res['ceiling_tasks_per_s'][k]['machine']:.0f}",
        )
    show(t)
    return res


def run_tail(svc: Services, args: argparse.Namespace) -> dict[str, Any]:
    n = args.n or DEFAULT_N["tail"]
    res = rttail.tail(svc, n, args.inflight)
    stag = res["variants"]["staggered-p95-b5"]
    res["met"] = (
        stag["p99_over_oracle"] <= GOALS["tail_p99_over_oracle"]
        and stag["extra_load"] <= GOALS["tail_extra_load"]
    )
    t = Table(
        title=f"tail cut: backend 5 ms median / 200 ms p99 (n={n} per variant, interleaved, "
        f"{args.inflight} in flight; goal staggered p99 ≤ 1.2× oracle at ≤ 5% extra load)"
    )
    cols = ("variant", "p50 ms", "p99 ms", "p99/oracle", "extra load", "delay ms", "backups")
    for c in (*cols, "backup lag p50/p99", "winner backend p50/p99"):
        t.add_column(c, justify="left" if c == "variant" else "right")
    for name, v in res["variants"].items():
        stag = "stag" in name
        w = v["winner_backend"]
        t.add_row(
            name,
            _f(v["p50_ms"]),
            _f(v["p99_ms"]),
            _f(v["p99_over_oracle"]),
            f"{v['extra_load']:.1%}",
            _f(v["delay_ms_p50"], 1) if stag else "—",
            str(v["backups"]),
            f"{_f(v['backup_lag_ms_p50'])} / {_f(v['backup_lag_ms_p99'])}" if stag else "—",
            f"{_f(w['p50_ms'])} / {_f(w['p99_ms'])}",
        )
    oracle_p99 = res["offline"]["min_of_two"]["p99_ms"]
    for name, o in res["offline"].items():
        t.add_row(
            f"offline: {name}",
            _f(o["p50_ms"]),
            _f(o["p99_ms"]),
            _f(o["p99_ms"] / oracle_p99),
            f"{o['extra_load']:.1%}",
            _f(o.get("delay_ms"), 1),
            *("—",) * 3,
            style="dim",
        )
    show(t)
    curve = Table(title="offline: ideal staggered launch (no overhead, no budget), by delay")
    for col in ("delay percentile", "delay ms", "extra load", "p99 ms", "p99/oracle"):
        curve.add_column(col, justify="right")
    for pt in res["offline_staggered_curve"]:
        curve.add_row(
            f"p{pt['percentile']}",
            _f(pt["delay_ms"], 1),
            f"{pt['extra_load']:.0%}",
            _f(pt["p99_ms"], 1),
            _f(pt["p99_ms"] / oracle_p99),
        )
    show(curve)
    return res


def run_loser(svc: Services, args: argparse.Namespace) -> dict[str, Any]:
    n = args.n or DEFAULT_N["loser"]
    res = rtbench.loser(svc, n)
    res["met"] = (
        res["stop_p50_ms"] <= GOALS["loser_p50_ms"] and res["stop_p95_ms"] <= GOALS["loser_p95_ms"]
    )
    t = Table(
        title=f"loser stop time after the winner, ms (n={n}, 10 ms winner, 2 s loser, "
        "cancel_losers; goal p50 ≤ 10, p95 ≤ 30)"
    )
    for c in ("p50", "p95", "p99", "max", "loser statuses", "not started at declaration"):
        t.add_column(c, justify="right")
    t.add_row(
        _f(res["stop_p50_ms"]),
        _f(res["stop_p95_ms"]),
        _f(res["stop_p99_ms"]),
        _f(res["stop_max_ms"]),
        json.dumps(res["loser_status"]),
        str(res["loser_not_started_at_declaration"]),
    )
    show(t)
    return res


RUNNERS: dict[str, Callable[[Services, argparse.Namespace], dict[str, Any]]] = {
    "overhead": run_overhead,
    "throughput": run_throughput,
    "tail": run_tail,
    "loser": run_loser,
}


# ---------------------------------------------------------------- main


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bench", choices=(*BENCHES, "all", "echo-peer"))
    p.add_argument("--n", type=int, help="calls per case (overhead 1000, tail 1500, loser 200)")
    p.add_argument("--json", type=Path, help="also write the JSON report here")
    p.add_argument("--concurrency", type=int, default=16, help="threads per worker")
    p.add_argument("--clients", type=int, default=32, help="throughput: groups in flight")
    p.add_argument("--duration", type=float, default=6.0, help="throughput: s per round")
    p.add_argument("--rounds", type=int, default=2, help="throughput: rounds per system")
    p.add_argument("--inflight", type=int, default=1, help="tail: groups in flight")
    p.add_argument("--bare-events", action="store_true", help="bare worker sends events too")
    p.add_argument("--timeout", type=float, default=1800.0, help="bound on the whole run (s)")
    p.add_argument("--url", help=argparse.SUPPRESS)  # echo-peer only
    args = p.parse_args(argv)
    if args.n is not None and args.n < 10:
        p.error("--n must be at least 10")
    return args


def _interrupt(signum: int, frame: object) -> None:
    raise Interrupted(f"signal {signum}: stopping")


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.bench == "echo-peer":
        echo_peer(args.url)
        return 0
    for s in (signal.SIGTERM, signal.SIGALRM):
        signal.signal(s, _interrupt)
    signal.alarm(int(args.timeout))
    names = BENCHES if args.bench == "all" else (args.bench,)
    report: dict[str, Any] = {"machine": machine(), "goals": GOALS, "results": {}}
    with tempfile.TemporaryDirectory(prefix="haco-bench-") as tmp:
        svc = Services(Path(tmp), args.concurrency, args.bare_events)
        report["redis"] = {
            "source": "embedded" if svc.embedded else "HACO_REDIS_URL",
            **server_info(svc.app_redis),
        }
        try:
            for name in names:
                svc.stop_workers()
                svc.flush()
                t0 = time.monotonic()
                try:
                    report["results"][name] = RUNNERS[name](svc, args)
                finally:
                    svc.stop_workers()
                report["results"][name]["wall_s"] = round(time.monotonic() - t0, 1)
        except (Interrupted, KeyboardInterrupt) as exc:
            report["interrupted"] = str(exc) or "interrupted"  # what finished is reported
            err.print(f"[bold red]interrupted:[/] {report['interrupted']}; services stopped")
        finally:
            signal.alarm(0)
            svc.close()
    report["machine"]["loadavg_after"] = list(machine()["loadavg"])
    text = json.dumps(report, indent=2, default=str)
    if args.json is not None:
        args.json.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 1 if "interrupted" in report else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
