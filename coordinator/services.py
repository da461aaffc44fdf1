"""Process supervision for `haco up`: services first, then one worker per zone; on the
way down the reverse (workers before servers), so no worker outlives its broker."""

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
from coordinator.embedded import EmbeddedRedis, resolve_redis_url

WORKER_STOP_TIMEOUT_S = 10.0  # Celery's warm shutdown waits for running members


def worker_command(zone: str, concurrency: int | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "coordinator.cli", "worker", "--zone", zone]
    if concurrency is not None:
        cmd += ["--concurrency", str(concurrency)]
    return cmd


@dataclass
class Stack:
    """What `haco up` started; :meth:`stop` takes it down in order."""

    redis_url: str
    embedded: EmbeddedRedis | None
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    log_dir: Path | None = None

    def env(self) -> dict[str, str]:
        return {**os.environ, "HACO_REDIS_URL": self.redis_url}

    def start_worker(self, zone: str, concurrency: int | None = None) -> subprocess.Popen[bytes]:
        log = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log = (self.log_dir / f"worker-{zone}.log").open("ab")
        proc = subprocess.Popen(
            worker_command(zone, concurrency),
            env=self.env(),
            stdout=log or subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        if log is not None:
            log.close()  # the child holds its own descriptor
        self.workers[zone] = proc
        return proc

    def stop(self) -> None:
        for proc in self.workers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.workers.values():
            try:
                proc.wait(WORKER_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.workers.clear()
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
