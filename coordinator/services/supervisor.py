"""Process supervision for `haco up`: services first, then one worker per zone and, when
a trace store is configured, one harvester; on the way down the reverse (workers and the
harvester before servers), so no worker outlives its broker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from coordinator.config import HacoSettings
from coordinator.services import embedded_pg
from coordinator.services.embedded_redis import EmbeddedRedis, resolve_redis_url
from coordinator.tracestore.db import connect
from coordinator.tracestore.migrate import migrate

JUDGE_WORKER = "(judge)"  # its key in Stack.workers: not a valid zone name
WORKER_STOP_TIMEOUT_S = 10.0  # Celery's warm shutdown waits for running members


def worker_command(zone: str, concurrency: int | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "coordinator.cli.main", "worker", "--zone", zone]
    if concurrency is not None:
        cmd += ["--concurrency", str(concurrency)]
    return cmd


def judge_command(concurrency: int | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "coordinator.cli.main", "worker", "--judge"]
    if concurrency is not None:
        cmd += ["--concurrency", str(concurrency)]
    return cmd


def harvester_command() -> list[str]:
    return [sys.executable, "-m", "coordinator.cli.main", "harvester"]


def beat_command() -> list[str]:
    return [sys.executable, "-m", "coordinator.cli.main", "beat"]


@dataclass
class Stack:
    """What `haco up` started; :meth:`stop` takes it down in order."""

    redis_url: str
    embedded: EmbeddedRedis | None
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    log_dir: Path | None = None
    harvester: subprocess.Popen[bytes] | None = None
    database_url: str | None = None
    embedded_pg: embedded_pg.EmbeddedPostgres | None = None
    beat: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        env = {**os.environ, "HACO_REDIS_URL": self.redis_url}
        if self.database_url:
            env["HACO_DATABASE_URL"] = self.database_url
        return env

    def _spawn(self, cmd: list[str], name: str) -> subprocess.Popen[bytes]:
        log = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log = (self.log_dir / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            cmd, env=self.env(), stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        if log is not None:
            log.close()  # the child holds its own descriptor
        return proc

    def start_worker(self, zone: str, concurrency: int | None = None) -> subprocess.Popen[bytes]:
        proc = self._spawn(worker_command(zone, concurrency), f"worker-{zone}")
        self.workers[zone] = proc
        return proc

    def start_judge(self, concurrency: int | None = None) -> subprocess.Popen[bytes]:
        """The judge queue's worker (`haco worker --judge`; needs the trace store and an
        [evaluator] in the pool config); stopped with the zone workers."""
        proc = self._spawn(judge_command(concurrency), "worker-judge")
        self.workers[JUDGE_WORKER] = proc
        return proc

    def start_harvester(self) -> subprocess.Popen[bytes]:
        self.harvester = self._spawn(harvester_command(), "harvester")
        return self.harvester

    def start_store(self, settings: HacoSettings) -> None:
        """The trace store: Postgres (embedded when HACO_DATABASE_URL is unset), its
        migrations, the harvester, and beat for the periodic recompute."""
        self.database_url, self.embedded_pg = embedded_pg.resolve_database_url(settings)
        with connect(self.database_url) as conn:
            conn.autocommit = True
            migrate(conn)
        self.start_harvester()
        self.beat = self._spawn(beat_command(), "beat")

    def stop(self) -> None:
        extra = [p for p in (self.harvester, self.beat) if p is not None]
        procs = [*self.workers.values(), *extra]
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(WORKER_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.workers.clear()
        self.harvester = self.beat = None
        if self.embedded_pg is not None:
            self.embedded_pg.stop()
            self.embedded_pg = None
        if self.embedded is not None:
            self.embedded.stop()
            self.embedded = None


def start_stack(
    settings: HacoSettings,
    zones: Sequence[str],
    concurrency: int | None = None,
    with_store: bool = False,
) -> Stack:
    """Redis and a worker per zone; with ``with_store`` (`haco up`) also the trace store.
    Without it, a harvester still starts when a trace store is already configured."""
    url, embedded = resolve_redis_url(settings)
    stack = Stack(url, embedded, log_dir=settings.state_dir / "logs")
    try:
        if with_store:
            stack.start_store(settings)
        for zone in zones:
            stack.start_worker(zone, concurrency)
        if not with_store and embedded_pg.running_url(settings):
            stack.start_harvester()
    except BaseException:
        stack.stop()
        raise
    return stack


def wait_for_signal() -> None:
    """Block until SIGINT or SIGTERM (Ctrl-C, or a supervisor stopping us)."""
    done = threading.Event()

    def handler(signum: int, frame: object) -> None:
        done.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not done.wait(0.5):
            pass
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
