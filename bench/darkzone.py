"""Issue 8, "a zone that goes dark": the only worker of the best-ranked zone is SIGKILLed
in the middle of a run of sequential invocations.

    python -m bench.darkzone [--before N] [--after N] [--deadline-s S] [--json PATH]

A `haco up`-style stack (Redis from HACO_REDIS_URL, else embedded; one `haco worker`
per zone local, regional, global) serves a role of three equally fast candidates (50 ms
wall clock, simulated with HACO_SIM_TIME_SCALE): the global one judged 0.85, the others
0.6, so the global one ranks first. After ``--before`` invocations the global worker is
killed; ``--after`` more follow. Measured: the latency of the first invocations after
the kill against the deadline, and how many invocations pass until latency is back
within 1.5× of the p95 before the kill (goal ≤ 20). JSON on stdout, a table on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.console import err, show
from bench.machine import machine, server_info
from bench.rtlib import BenchStack, Services
from coordinator.config import HacoSettings
from coordinator.core.percentiles import nearest_rank
from coordinator.runtime.client import HacoClient

ZONES = ("local", "regional", "global")
DARK = "global"
LATENCY_S = 0.05  # every candidate's wall-clock latency
SCALE = 0.02  # simulated seconds x SCALE = wall clock
ROLE = "darkzone"
CANDIDATES = [("good", "global"), ("fair", "regional"), ("fair", "local")]
QUALITY = {"good": 0.85, "fair": 0.6}
GOAL_RECOVERY = 20  # invocations
RATIO = 1.5  # "back": within this factor of the p95 before the kill


def write_pool(folder: Path) -> Path:
    lines = ['name = "darkzone"', 'caller_zone = "local"', f"zones = {json.dumps(ZONES)}"]
    lines += ["[network]", "timeout_s = 1.0"]
    for zone in ZONES:
        lines += ["[[links]]", 'a = "local"', f'b = "{zone}"', "latency_ms = 1", "jitter_ms = 0"]
        lines += ["bandwidth_tokens_per_ms = 1000", "loss = 0"]
    for model, q in QUALITY.items():
        lines += [f"[models.{model}]", f"quality = {{ mean = {q}, concentration = 1000 }}"]
        lines += [f'latency = {{ kind = "lognormal", median_s = {LATENCY_S / SCALE}, sigma = 0 }}']
        lines += ["tokens_out = { median = 20, sigma = 0 }"]
    lines += ["[evaluator]", 'model = "fair"', 'zone = "local"']
    for i, (model, zone) in enumerate(CANDIDATES):
        lines += ["[[candidates]]", f'id = "{ROLE}-{i}"', f'role = "{ROLE}"']
        lines += [f'model = "{model}"', f'zone = "{zone}"', "failure_rate = 0"]
    (folder / "scenario.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    pool = folder / "pool.toml"
    pool.write_text(
        f'caller_zone = "local"\nzones = {json.dumps(ZONES)}\n\n[sim]\n'
        f'scenario = "scenario.toml"\ntime_scale = {SCALE}\n',
        encoding="utf-8",
    )
    return pool


class ZoneServices(Services):
    """bench.rtlib's services with this benchmark's pool and one worker per zone."""

    pool_file: Path

    def _stack(self) -> BenchStack:
        self.pool_file = write_pool(self.tmp)
        env = {"HACO_POOL_FILE": str(self.pool_file), "HACO_STATE_DIR": str(self.tmp / "state")}
        return BenchStack(self.url, None, log_dir=self.tmp / "logs", extra_env=env)

    def start_zones(self) -> None:
        for zone in ZONES:
            self.stack.start_worker(zone, self.concurrency)


def recovery(latencies: list[float], limit_s: float) -> int:
    """Invocations after the kill until every later one is within ``limit_s`` (0: none
    exceeded it)."""
    over = [i for i, x in enumerate(latencies) if x > limit_s]
    return over[-1] + 1 if over else 0


def run(svc: ZoneServices, args: argparse.Namespace) -> dict[str, Any]:
    settings = HacoSettings(redis_url=svc.url, pool_file=svc.pool_file)
    update = {"start_timeout_min_s": args.start_timeout_min_s}
    update |= {"dark_zone_cooldown_s": args.dark_zone_cooldown_s}
    settings = settings.model_copy(update={k: v for k, v in update.items() if v is not None})
    # Until every zone's worker is up its queue is "dark": wait for them patiently.
    patient = settings.model_copy(update={"start_timeout_min_s": 60.0})
    with HacoClient(patient, redis_url=svc.url) as ready:
        ready.invoke(ROLE, "ready?", deadline_s=60.0)
    with HacoClient(settings, redis_url=svc.url) as client:
        before = [client.invoke(ROLE, "hi", deadline_s=args.deadline_s) for _ in range(args.before)]
        proc = svc.stack.workers[DARK]
        proc.kill()  # SIGKILL
        proc.wait()
        killed_at = time.time()
        after = [client.invoke(ROLE, "hi", deadline_s=args.deadline_s) for _ in range(args.after)]
    lat_b = [r.latency_s for r in before[2:]]
    lat_a = [r.latency_s for r in after]
    base = nearest_rank(lat_b, 95.0)
    n_rec = recovery(lat_a, RATIO * base)
    tail = lat_a[n_rec:]
    return {
        "settings": {
            "deadline_s": args.deadline_s,
            "start_timeout_min_s": settings.start_timeout_min_s,
            "patience_min_s": settings.patience_min_s,
            "dark_zone_cooldown_s": settings.dark_zone_cooldown_s,
            "before": args.before,
            "after": args.after,
        },
        "winner_zones_before": sorted({r.zone for r in before}),
        "p95_before_ms": base * 1e3,
        "first_after_ms": [x * 1e3 for x in lat_a[:5]],
        "max_after_ms": max(lat_a) * 1e3,
        "waited_for_deadline": sum(x >= args.deadline_s for x in lat_a),
        "dark_wins": sum(r.zone == DARK for r in after),
        "not_won": sum(r.winner_id is None for r in after),
        "recovered_after": n_rec,
        "slow_after": sum(x > RATIO * base for x in lat_a),  # first wait + re-probes
        "p95_after_recovery_ms": nearest_rank(tail, 95.0) * 1e3 if tail else None,
        "met": n_rec <= GOAL_RECOVERY and max(lat_a) < args.deadline_s,
        "killed_at": killed_at,
    }


def table(res: dict[str, Any]) -> Table:
    s = res["settings"]
    t = Table(
        title=f"a zone that goes dark (its only worker SIGKILLed; deadline {s['deadline_s']} s, "
        f"start timeout floor {s['start_timeout_min_s']} s; goal: back within {RATIO}× in "
        f"≤ {GOAL_RECOVERY} invocations)"
    )
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row("p95 before the kill, ms", f"{res['p95_before_ms']:.1f}")
    t.add_row("first 5 after the kill, ms", ", ".join(f"{x:.0f}" for x in res["first_after_ms"]))
    t.add_row("max after the kill, ms", f"{res['max_after_ms']:.0f}")
    t.add_row("invocations that waited for the deadline", str(res["waited_for_deadline"]))
    t.add_row(f"invocations until back within {RATIO}× p95", str(res["recovered_after"]))
    t.add_row(f"invocations slower than {RATIO}× p95 (re-probes)", str(res["slow_after"]))
    p95 = res["p95_after_recovery_ms"]
    t.add_row("p95 after that, ms", "—" if p95 is None else f"{p95:.1f}")
    t.add_row("goal met", str(res["met"]))
    return t


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.darkzone", description=__doc__)
    p.add_argument("--before", type=int, default=20)
    p.add_argument("--after", type=int, default=40)
    p.add_argument("--deadline-s", type=float, default=10.0)
    p.add_argument("--start-timeout-min-s", type=float, default=None, help="default: settings")
    p.add_argument("--dark-zone-cooldown-s", type=float, default=None, help="default: settings")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--json", type=Path, default=None)
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    report: dict[str, Any] = {"machine": machine()}
    with tempfile.TemporaryDirectory(prefix="haco-darkzone-") as tmp:
        svc = ZoneServices(Path(tmp), args.concurrency)
        report["redis"] = {
            "source": "embedded" if svc.embedded else "HACO_REDIS_URL",
            **server_info(svc.app_redis),
        }
        try:
            svc.flush()
            svc.start_zones()
            t0 = time.monotonic()
            report["result"] = run(svc, args)
            report["result"]["wall_s"] = round(time.monotonic() - t0, 1)
        finally:
            svc.close()
    show(table(report["result"]))
    text = json.dumps(report, indent=2, default=str)
    if args.json is not None:
        args.json.write_text(text + "\n", encoding="utf-8")
    print(text)
    err.print(f"wall: {report['result']['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
