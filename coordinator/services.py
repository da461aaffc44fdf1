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

from coordinator import embedded_pg
from coordinator.config import HacoSettings
from coordinator.embedded import EmbeddedRedis, resolve_redis_url

WORKER_STOP_TIMEOUT_S = 10.0  # Celery's warm shutdown waits for running members


def worker_command(zone: str, concurrency: int | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "coordinator.cli", "worker", "--zone", zone]
    if concurrency is not None:
        cmd += ["--concurrency", str(concurrency)]
    return cmd


def harvester_command() -> list[str]:
    return [sys.executable, "-m", "coordinator.cli", "harvester"]


@dataclass
class Stack:
    """What `haco up` started; :meth:`stop` takes it down in order."""

    redis_url: str
    embedded: EmbeddedRedis | None
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    log_dir: Path | None = None
    harvester: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        return {**os.environ, "HACO_REDIS_URL": self.redis_url}

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

    def start_harvester(self) -> subprocess.Popen[bytes]:
        self.harvester = self._spawn(harvester_command(), "harvester")
        return self.harvester

    def stop(self) -> None:
        procs = [*self.workers.values(), *([self.harvester] if self.harvester else [])]
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
        self.harvester = None
        if self.embedded is not None:
            self.embedded.stop()
            self.embedded = None


def start_stack(
    settings: HacoSettings, zones: Sequence[str], concurrency: int | None = None
) -> Stack:
    url, embedded = resolve_redis_url(settings)
    stack = Stack(url, embedded, log_dir=settings.state_dir / "logs")
    try:
        for zone in zones:
            stack.start_worker(zone, concurrency)
        if settings.database_url or embedded_pg.discover(settings.state_dir):
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
