"""`haco demo`: the paper's multi-agent workflow through the real distributed path.

Starts an embedded Redis and one Celery worker per zone (the paper's simulated pool,
three zones), then drives the DATAWISE-style workflow twice side by side on the same
workers: once through HACO, once through a single-route baseline (one fixed candidate
per role in the Global zone, the strongest model). Partway through, a Global-zone outage
is injected (every message to Global is lost). A live display shows the queues, hedge
sizes, winners and failures; a summary compares the two at the end.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import redis
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from coordinator.config import HacoSettings
from coordinator.errors import HedgeError, InputError
from coordinator.runtime.client import HacoClient
from coordinator.runtime.coordinator import InvocationResult
from coordinator.runtime.pool import default_pool
from coordinator.services.supervisor import Stack, start_stack
from coordinator.state import keys
from coordinator.state.broker import with_db
from coordinator.state.keys import queue_for
from schemas.models import Candidate
from schemas.pool import PoolConfig
from sim.scenario import load_builtin
from sim.workflow import Invocation, StepResult, TaskOutcome, datawise_task

REFRESH_PER_S = 4


@dataclass(frozen=True)
class Outage:
    zone: str
    at_task: int

    @classmethod
    def parse(cls, text: str, zones: frozenset[str]) -> Outage:
        zone, sep, at = text.partition("@")
        if not sep or not at.isdigit():
            raise InputError(f"--outage={text!r}; expected ZONE@TASK, e.g. global@8")
        if zone not in zones:
            raise InputError(f"--outage zone {zone!r} is not one of {sorted(zones)}")
        return cls(zone, int(at))


@dataclass
class Track:
    """Live statistics of one method."""

    name: str
    tasks_done: int = 0
    completed: int = 0
    steps: int = 0
    all_failed: int = 0
    tokens: int = 0
    latency_s: float = 0.0
    hedge_sizes: Counter[int] = field(default_factory=Counter)
    winners_before: Counter[str] = field(default_factory=Counter)
    winners_after: Counter[str] = field(default_factory=Counter)
    failed_before: int = 0
    steps_before: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(
        self, res: InvocationResult | None, launched: int, after: bool, elapsed: float
    ) -> None:
        with self.lock:
            self.steps += 1
            self.latency_s += elapsed
            self.hedge_sizes[launched] += 1
            if not after:
                self.steps_before += 1
            if res is None:
                self.all_failed += 1
                if not after:
                    self.failed_before += 1
                return
            self.tokens += res.tokens
            (self.winners_after if after else self.winners_before)[res.zone or "?"] += 1


def fixed_route_pool(base: PoolConfig, zone: str) -> PoolConfig:
    """One candidate per role, the first of each role in ``zone`` (a single route)."""
    chosen: dict[str, Candidate] = {}
    for c in base.candidates:
        if c.zone == zone and c.role not in chosen:
            chosen[c.role] = c
    return base.model_copy(update={"candidates": list(chosen.values())})


class Driver(threading.Thread):
    """Runs tasks through one client, recording each step into its Track."""

    def __init__(
        self,
        client: HacoClient,
        track: Track,
        tasks: int,
        outage_started: threading.Event,
        seed: int,
    ) -> None:
        super().__init__(daemon=True, name=f"demo-{track.name}")
        self.client, self.track, self.tasks = client, track, tasks
        self.outage_started, self.seed = outage_started, seed
        self.error: BaseException | None = None

    def step(self, inv: Invocation) -> StepResult:
        after = self.outage_started.is_set()
        t0 = time.monotonic()
        try:
            res = self.client.invoke(inv.role, f"{inv.state.value}: " + "x" * inv.request_bytes)
        except HedgeError as exc:
            launched = len(getattr(exc, "failures", {}))
            self.track.record(None, launched, after, time.monotonic() - t0)
            return StepResult(ok=False)
        launched = sum(1 for m in res.members if m.launched)
        self.track.record(res, launched, after, time.monotonic() - t0)
        won = next((m for m in res.members if m.member_id == res.winner_id), None)
        return StepResult(True, res.quality or 0.0, won.tokens_out if won else 0)

    def run(self) -> None:
        rng = np.random.default_rng(self.seed)
        spec = load_builtin("overall").workload.model_copy(update={"max_invocation_retries": 1})
        try:
            for _ in range(self.tasks):
                ctl = datawise_task(spec, rng)
                outcome: TaskOutcome
                try:
                    inv = next(ctl)
                    while True:
                        inv = ctl.send(self.step(inv))
                except StopIteration as stop:
                    outcome = stop.value
                with self.track.lock:
                    self.track.tasks_done += 1
                    self.track.completed += int(outcome.completed)
        except BaseException as exc:  # surfaced by the main thread
            self.error = exc


def queue_depths(broker: redis.Redis, zones: list[str]) -> dict[str, int]:
    return {z: int(broker.llen(queue_for(z))) for z in zones}


def live_view(tracks: list[Track], depths: dict[str, int], outage: Outage, hit: bool) -> Group:
    q = Table(title="queues (member tasks waiting)")
    for z in depths:
        q.add_column(z, justify="right")
    q.add_row(*[str(v) for v in depths.values()])
    t = Table(title=f"outage {outage.zone}@task {outage.at_task}: {'ON' if hit else 'not yet'}")
    for col in ("method", "tasks", "steps", "all-failed", "hedge sizes", "winner zones"):
        t.add_column(col)
    for tr in tracks:
        with tr.lock:
            sizes = " ".join(f"{k}:{v}" for k, v in sorted(tr.hedge_sizes.items()))
            wins = tr.winners_before + tr.winners_after
            zones = " ".join(f"{k}:{v}" for k, v in sorted(wins.items()))
            t.add_row(tr.name, str(tr.tasks_done), str(tr.steps), str(tr.all_failed), sizes, zones)
    return Group(q, t)


def summary(tracks: list[Track], zone: str) -> Table:
    t = Table(title="HACO against a single route, same workers, same outage")
    for col in (
        "method",
        "tasks",
        "completed %",
        "all-failed % before",
        "all-failed % after",
        "tokens/task",
        "s/step",
        f"{zone} wins before→after %",
    ):
        t.add_column(col, justify="right")
    for tr in tracks:
        after_steps = tr.steps - tr.steps_before
        failed_after = tr.all_failed - tr.failed_before
        wb, wa = tr.winners_before, tr.winners_after
        share_b = 100 * wb[zone] / max(1, sum(wb.values()))
        share_a = 100 * wa[zone] / max(1, sum(wa.values()))
        t.add_row(
            tr.name,
            str(tr.tasks_done),
            f"{100 * tr.completed / max(1, tr.tasks_done):.0f}",
            f"{100 * tr.failed_before / max(1, tr.steps_before):.1f}",
            f"{100 * failed_after / max(1, after_steps):.1f}",
            f"{tr.tokens / max(1, tr.tasks_done) / 1000:.1f}k",
            f"{tr.latency_s / max(1, tr.steps):.2f}",
            f"{share_b:.0f}→{share_a:.0f}",
        )
    return t


def run_demo(tasks: int, outage_text: str, time_scale: float, console: Console) -> list[Track]:
    base = default_pool()
    zones = sorted(base.zones)
    outage = Outage.parse(outage_text, frozenset(zones))
    if tasks < 1:
        raise InputError(f"--tasks={tasks}; expected at least 1")
    with tempfile.TemporaryDirectory(prefix="haco-demo-") as state:
        settings = HacoSettings(
            redis_url=None,
            state_dir=Path(state),
            sim_time_scale=time_scale,
            default_deadline_s=30.0,
        )
        stack = start_stack(settings, zones)
        try:
            return _drive(stack, settings, base, tasks, outage, console)
        finally:
            stack.stop()


def _drive(
    stack: Stack,
    settings: HacoSettings,
    base: PoolConfig,
    tasks: int,
    outage: Outage,
    console: Console,
) -> list[Track]:
    app_db = redis.Redis.from_url(with_db(stack.redis_url, keys.APP_DB))
    broker = redis.Redis.from_url(with_db(stack.redis_url, keys.BROKER_DB))
    clients = [
        HacoClient(settings, base, redis_url=stack.redis_url),
        HacoClient(settings, fixed_route_pool(base, outage.zone), redis_url=stack.redis_url),
    ]
    tracks = [Track("haco"), Track(f"single route ({outage.zone})")]
    hit = threading.Event()
    drivers = [Driver(c, t, tasks, hit, seed=7) for c, t in zip(clients, tracks, strict=True)]
    try:
        for d in drivers:
            d.start()
        pace = threading.Event()  # never set: an interruptible wait between refreshes
        with Live(console=console, refresh_per_second=REFRESH_PER_S, transient=False) as live:
            while any(d.is_alive() for d in drivers):
                if not hit.is_set() and tracks[0].tasks_done >= outage.at_task:
                    app_db.hset(keys.SIM_FAULTS, outage.zone, 1.0)
                    app_db.pexpire(keys.SIM_FAULTS, int(settings.group_ttl_s * 1000))
                    hit.set()
                live.update(
                    live_view(
                        tracks, queue_depths(broker, sorted(base.zones)), outage, hit.is_set()
                    )
                )
                pace.wait(1.0 / REFRESH_PER_S)
        for d in drivers:
            if d.error is not None:
                raise d.error
        console.print()
        console.print(summary(tracks, outage.zone))
        return tracks
    finally:
        for c in clients:
            c.close()
        app_db.close()
        broker.close()
