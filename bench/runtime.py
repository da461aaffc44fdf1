"""Runtime benchmarks of HACO's distributed path (Celery workers + Redis), side by side
with their floors: a raw Redis echo between two processes and a bare Celery app.

    python -m bench.runtime overhead|throughput|tail|loser|all [--n N] [--json PATH]
    python -m bench.runtime growth planning [--levels 1,8,32,128] [--sizes 6,24,200]
    python -m bench.runtime overhead --pin client=0 --pin workers=1 --pin redis=1

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

import numpy as np
from rich.table import Table

from bench import hotpath_goals, rtbench, rtgrowth, rtoverhead, rtplan, rtsnapshot, rttail
from bench.console import err, show
from bench.hotpath_goals import GOALS
from bench.hotpath_tables import span, times
from bench.machine import after, machine, server_info
from bench.pinning import pin_arg, pin_option
from bench.rtlib import ZONE, ZONE2, Services, echo_floor, echo_peer, summary_ms

BENCHES = ("overhead", "throughput", "tail", "loser")  # `all`
CURVES = ("growth", "planning")  # issue 12's growth curves, run by name
DEFAULT_N = {"overhead": 1000, "tail": 1500, "loser": 200, "planning": 500}
# --duration / --rounds unless given. Throughput alternates its three phases in 4 short
# rounds rather than 2 long ones: on a noisy machine a burst of other load then spoils
# one round of four, not one of two. Growth: one short round at each of four levels.
DEFAULT_LOAD = {"throughput": (3.0, 4), "growth": (3.0, 1)}


class Interrupted(Exception):
    pass


def _f(x: Any, digits: int = 2) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


# ---------------------------------------------------------------- benchmarks


def run_overhead(svc: Services, args: argparse.Namespace) -> dict[str, Any]:
    n = args.n or DEFAULT_N["overhead"]
    floor = summary_ms(echo_floor(svc.url, n))
    svc.start_bare()
    svc.start_haco((ZONE, ZONE2))
    measured = rtoverhead.overhead(svc, n)
    bare, one = measured["bare_celery_roundtrip"], measured["haco_1"]
    res: dict[str, Any] = {"n": n, "floor_echo": floor, **measured}
    res["goals"] = hotpath_goals.overhead_goals(res)
    res["met"] = {k: res["goals"][k] for k in ("haco_1", "haco_2")}
    t = Table(
        title=f"dispatch overhead, ms (n={n} sequential calls each, in {measured['rounds']} "
        "interleaved blocks; goal 1 member p50 ≤ 0.75× bare p50, p99 ≤ bare p99; 2 members "
        "≤ 1.2× 1 member)"
    )
    for c in ("what", "p50", "p90", "p99", "max"):
        t.add_column(c, justify="left" if c == "what" else "right")

    def row(name: str, s: dict[str, Any]) -> None:
        t.add_row(name, _f(s["p50_ms"]), _f(s["p90_ms"]), _f(s["p99_ms"]), _f(s["max_ms"]))

    row("floor: Redis LPUSH→BRPOP echo, 2 processes", floor)
    row("bare Celery round trip (send_task → LPUSH → BRPOP)", bare)
    sleep = f"sleeping {measured['bare_sleep_ms']:.2f} ms (the members' draw)"
    row(f"bare Celery, 1 task {sleep}: round trip − its own time", measured["bare_celery_1_task"])
    row(
        f"bare Celery, 2 tasks {sleep}: first reply − fastest task's own",
        measured["bare_celery_2_tasks"],
    )
    variants = rtoverhead.variants(measured)
    for name, r in variants:
        row(f"HACO {name}: group latency (caller)", r["group_e2e"])
        row(f"HACO {name}: overhead = group − fastest member", r["overhead"])
        row(f"HACO {name}: overhead, coordinator's latency_s", r["overhead_coordinator"])
        if r.get("beyond_draw"):
            row(f"HACO {name}: group − fastest backend draw", r["beyond_draw"])
    show(t)
    b = Table(title="where the overhead goes (fastest member), ms p50 / p99")
    b.add_column("stage")
    for name, _ in variants:
        b.add_column(name.removesuffix(", first").removesuffix(", parallel"), justify="right")
    for stage in one["breakdown_p50_ms"]:
        b.add_row(
            stage,
            *(
                f"{r['breakdown_p50_ms'][stage]:.3f} / {r['breakdown_p99_ms'][stage]:.3f}"
                for _, r in variants
            ),
        )
    show(b)
    _print_intervals(res["goals"], measured["rounds"])
    for name, r in variants:
        if (order := r.get("by_start_order")) is not None:
            members = "; ".join(
                f"#{i + 1} starts {m['start_after_send_p50_ms']:.2f} ms after the send, own "
                f"{m['own_p50_ms']:.2f} ms"
                for i, m in enumerate(order["members"])
            )
            err.print(
                f"HACO {name}, members by start order (p50): {members}; the first to start "
                f"is the fastest in {order['first_started_fastest']:.0%} of groups and wins "
                f"{order['first_started_won']:.0%}"
            )
    return res


def _print_intervals(g: dict[str, Any], rounds: int) -> None:
    """The overhead goals' ratios with their 90% intervals over the run's blocks."""
    for label, point, ci in (
        ("1 member / bare Celery", "overhead_p{q}_over_bare_p{q}", "one_over_bare_p{q}_ci90"),
        ("2 members / 1 member", "two_over_one_p{q}", "two_over_one_p{q}_ci90"),
        ("bare Celery, 2 tasks / 1 task", "bare_two_over_one_p{q}", "bare_two_over_one_p{q}_ci90"),
        ("2 members / bare 2 tasks", "two_over_bare_two_p{q}", "two_over_bare_two_p{q}_ci90"),
    ):
        if point.format(q=50) not in g:
            continue
        parts = [f"{times(g[point.format(q=q)])} ({span(g.get(ci.format(q=q)))})" for q in (50, 99)]
        err.print(f"{label}, p50 · p99: {' · '.join(parts)}, 90% intervals over {rounds} blocks")


def run_throughput(svc: Services, args: argparse.Namespace) -> dict[str, Any]:
    dur, rounds = _load_args(args, "throughput")
    res = rtbench.throughput(svc, args.clients, dur, rounds)
    res["goals"] = hotpath_goals.throughput_goals(res)
    res["met"] = {k: v["throughput_met"] and v["worker_cpu_met"] for k, v in res["goals"].items()}
    t = Table(
        title=f"throughput, member tasks/s ({args.clients} client threads, "
        f"{rounds}×{dur:g} s per system, worker concurrency {svc.concurrency}; "
        "goal ≥ 90% of bare, worker CPU/task ≤ 1.2× bare)"
    )
    cols = ("system", "tasks/s (median)", "groups/s", "vs bare", "per round")
    for c in (*cols, "CPU ms/task: client · worker · redis", "ceiling/s: worker · 2 cores"):
        t.add_column(c, justify="left" if c == "system" else "right")
    for k, v in res["median_tasks_per_s"].items():
        per_round = ", ".join(f"{x['tasks_per_s']:.0f}" for x in res["runs"][k])
        ratio = res["ratio_to_bare"].get(k)
        cpu = res["cpu_ms_per_task"][k]
        worker = cpu["worker_bare" if k == "bare" else "worker_local"]
        t.add_row(
            k,
            f"{v:.0f}",
            f"{res['median_groups_per_s'][k]:.0f}",
            "—" if ratio is None else f"{ratio:.0%}",
            per_round,
            f"{cpu['client']:.2f} · {worker:.2f} · {cpu['redis']:.2f}",
            f"{res['ceiling_tasks_per_s'][k]['worker']:.0f} · "
            f"{res['ceiling_tasks_per_s'][k]['machine']:.0f}",
        )
    show(t)
    return res


def run_tail(svc: Services, args: argparse.Namespace) -> dict[str, Any]:
    n = args.n or DEFAULT_N["tail"]
    res = rttail.tail(svc, n, args.inflight, args.goal_n)
    res["goals"] = hotpath_goals.tail_goals(res)
    res["met"] = res["goals"]["met"]
    g = res["goals"]
    lo, hi = g["p99_over_ideal_ci90"] or (None, None)
    err.print(
        f"{g['variant']}: p99 {g['p99_ms']:.1f} ms at {g['extra_load']:.1%} extra load; the "
        f"ideal staggered launch at that load {_f(g['ideal_p99_ms_at_extra_load'], 1)} ms "
        f"(ratio {_f(g['p99_over_ideal'])}, 90% interval {_f(lo)}–{_f(hi)}, goal ≤ "
        f"{GOALS['tail_p99_over_ideal']}); the same calls with no runtime cost "
        f"{_f(g['same_draws_p99_ms'], 1)} ms: policy {_f(g['same_draws_over_ideal'])}× the "
        f"ideal, runtime {_f(g['runtime_over_same_draws'])}× that"
    )
    v, pi = res["variants"][g["variant"]], g["paired"] or {}
    if v.get("refused") and pi:
        err.print(
            f"backups refused: {v['refused']['budget']} (calls past their delay alone: "
            f"{v['refused']['over_delay']}); against the ideal on the run's own draws the "
            f"policy {_f(pi['same_draws_over'])}×, {_f(pi['draws_over'])}× on the backend's "
            f"draws (the members' overhead out), {_f(pi['draws_paid_over'])}× with every "
            "refused backup paid"
        )
    for what, c in (hotpath_goals.tail_call_cost(res) or {}).items():
        less = {"runtime_cost": "its member's or task's own time", "beyond_draw": "its draw"}
        err.print(
            f"one call's round trip less {less[what]}, p50 / p99: HACO, one member "
            f"{_f(c['haco_p50_ms'])} / {_f(c['haco_p99_ms'])} ms; bare Celery "
            f"{_f(c['bare_p50_ms'])} / {_f(c['bare_p99_ms'])} ms"
        )
    t = Table(
        title=f"tail cut: backend 5 ms median / 200 ms p99 (n={n} per variant, "
        f"{args.goal_n} of {hotpath_goals.TAIL_VARIANT}, interleaved, "
        f"{args.inflight} in flight; goal staggered p99 ≤ 1.05× the ideal staggered launch "
        "at the same extra load, ≤ 5%)"
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
    res["met"] = hotpath_goals.loser_met(res)
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


def run_growth(svc: Services, args: argparse.Namespace) -> dict[str, Any]:
    dur, rounds = _load_args(args, "growth")
    res = rtgrowth.growth(svc, args.levels, dur, rounds)
    rtgrowth.show_growth(res)
    return res


def run_planning(svc: Services, args: argparse.Namespace) -> dict[str, Any]:
    res = rtplan.planning(svc, args.sizes, args.n or DEFAULT_N["planning"])
    rng = np.random.default_rng(1)
    for case in res["cases"]:  # after the parts: its snapshots replace their profiles
        case["after_snapshot"] = rtsnapshot.after_snapshot(svc, case["candidates"], rng)
    rtplan.show_planning(res)
    return res


def _load_args(args: argparse.Namespace, bench: str) -> tuple[float, int]:
    dur, rounds = DEFAULT_LOAD[bench]
    return args.duration or dur, args.rounds or rounds


RUNNERS: dict[str, Callable[[Services, argparse.Namespace], dict[str, Any]]] = {
    "overhead": run_overhead,
    "throughput": run_throughput,
    "tail": run_tail,
    "loser": run_loser,
    "growth": run_growth,
    "planning": run_planning,
}


# ---------------------------------------------------------------- main


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "bench", nargs="+", choices=(*BENCHES, *CURVES, "all", "echo-peer"),
        help="benchmarks to run in this order; all = the four issue-3 ones",
    )  # fmt: skip
    p.add_argument(
        "--n", type=int, help="calls per case (overhead 1000, tail 1500, loser 200, planning 500)"
    )
    p.add_argument("--json", type=Path, help="also write the JSON report here")
    p.add_argument("--concurrency", type=int, default=16, help="threads per worker")
    p.add_argument("--clients", type=int, default=32, help="throughput: groups in flight")
    p.add_argument("--duration", type=float, help="throughput (6), growth (3): s per round")
    p.add_argument("--rounds", type=int, help="throughput (2), growth (1): rounds per system")
    p.add_argument("--levels", type=_ints, default=rtgrowth.LEVELS, help="growth: in flight")
    p.add_argument("--sizes", type=_ints, default=rtplan.SIZES, help="planning: pool sizes")
    p.add_argument("--inflight", type=int, default=1, help="tail: groups in flight")
    p.add_argument(
        "--goal-n", type=int, default=rttail.GOAL_N,
        help=f"tail: calls of the goal's variant ({hotpath_goals.TAIL_VARIANT}; {rttail.GOAL_N})",
    )  # fmt: skip
    p.add_argument("--bare-events", action="store_true", help="bare worker sends events too")
    p.add_argument(
        "--celery-consumer",
        action="store_true",
        help="HACO's workers run members through Celery's consumer, not the member lane",
    )
    pin_arg(p)
    p.add_argument("--timeout", type=float, default=1800.0, help="bound on the whole run (s)")
    p.add_argument("--url", help=argparse.SUPPRESS)  # echo-peer only
    args = p.parse_args(argv)
    if args.n is not None and args.n < 10:
        p.error("--n must be at least 10")
    if args.goal_n < 10:
        p.error(f"--goal-n must be at least 10, got {args.goal_n}")
    args.pin = pin_option(p, args.pin)
    return args


def _ints(text: str) -> tuple[int, ...]:
    values = tuple(int(x) for x in text.split(",") if x.strip())
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers like 1,8,32")
    return values


def _interrupt(signum: int, frame: object) -> None:
    raise Interrupted(f"signal {signum}: stopping")


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.bench == ["echo-peer"]:
        echo_peer(args.url)
        return 0
    for s in (signal.SIGTERM, signal.SIGALRM):
        signal.signal(s, _interrupt)
    signal.alarm(int(args.timeout))
    names = [b for name in args.bench for b in (BENCHES if name == "all" else (name,))]
    report: dict[str, Any] = {
        "command": " ".join(["python -m bench.runtime", *argv]),
        "machine": machine(),
        "goals": GOALS,
        "results": {},
    }
    report["pin"] = args.pin.describe() if args.pin is not None else None
    with tempfile.TemporaryDirectory(prefix="haco-bench-") as tmp:
        svc = Services(
            Path(tmp), args.concurrency, args.bare_events, not args.celery_consumer, args.pin
        )
        report["member_lane"] = svc.lane
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
    report["machine"] = after(report["machine"])
    text = json.dumps(report, indent=2, default=str)
    if args.json is not None:
        args.json.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 1 if "interrupted" in report else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
