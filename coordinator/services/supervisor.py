"""Process supervision for `haco up`: services first, then one worker per zone and, when
a trace store is configured, one harvester and beat (and the judge, and Flower with
``--flower``); on the way down the reverse (workers, harvester, beat and Flower before
the servers), so no worker outlives its broker.

While `haco up` waits for Ctrl-C, :mod:`coordinator.services.watchdog` restarts what
dies (delays from :mod:`coordinator.services.restart`) and keeps the status file.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from coordinator.config import HacoSettings
from coordinator.services import embedded_pg
from coordinator.services.embedded_redis import EmbeddedRedis, resolve_redis_url
from coordinator.services.flower import flower_argv, flower_url
from coordinator.tracestore.db import connect
from coordinator.tracestore.migrate import migrate

JUDGE_WORKER = "(judge)"  # its key in Stack.workers: not a valid zone name
WORKER_STOP_TIMEOUT_S = 10.0  # Celery's warm shutdown waits for running members
REDIS, POSTGRES, HARVESTER, BEAT, FLOWER = "redis", "postgres", "harvester", "beat", "flower"
SERVERS = (REDIS, POSTGRES)

log = logging.getLogger(__name__)


def worker_name(zone: str) -> str:
    """A worker's process name (its log file and its entry in the status file)."""
    return "worker-judge" if zone == JUDGE_WORKER else f"worker-{zone}"


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
    flower: subprocess.Popen[bytes] | None = None
    flower_url: str | None = None
    # Given to every child as HACO_STATE_DIR, so they find the same embedded servers.
    state_dir: Path | None = None
    # Extra environment of every child (HACO_TASK_EVENTS=true with Flower).
    child_env: dict[str, str] = field(default_factory=dict)
    # The command each child was started with, by process name: what a restart runs.
    commands: dict[str, list[str]] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        env = {**os.environ, "HACO_REDIS_URL": self.redis_url}
        if self.database_url:
            env["HACO_DATABASE_URL"] = self.database_url
        if self.state_dir is not None:
            env["HACO_STATE_DIR"] = str(self.state_dir)
        return {**env, **self.child_env}

    def _spawn(self, cmd: list[str], name: str) -> subprocess.Popen[bytes]:
        log_file = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log_file = (self.log_dir / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            cmd, env=self.env(), stdout=log_file or subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        if log_file is not None:
            log_file.close()  # the child holds its own descriptor
        self.commands[name] = cmd
        return proc

    def start_worker(self, zone: str, concurrency: int | None = None) -> subprocess.Popen[bytes]:
        proc = self._spawn(worker_command(zone, concurrency), worker_name(zone))
        self.workers[zone] = proc
        return proc

    def start_judge(self, concurrency: int | None = None) -> subprocess.Popen[bytes]:
        """The judge queue's worker (`haco worker --judge`; needs the trace store and an
        [evaluator] in the pool config); stopped with the zone workers."""
        proc = self._spawn(judge_command(concurrency), worker_name(JUDGE_WORKER))
        self.workers[JUDGE_WORKER] = proc
        return proc

    def start_harvester(self) -> subprocess.Popen[bytes]:
        self.harvester = self._spawn(harvester_command(), HARVESTER)
        return self.harvester

    def start_flower(self, port: int) -> subprocess.Popen[bytes]:
        """Celery Flower on 127.0.0.1:``port`` (:mod:`coordinator.services.flower`)."""
        self.flower = self._spawn(flower_argv(self.redis_url, port), FLOWER)
        self.flower_url = flower_url(port)
        return self.flower

    def start_store(self, settings: HacoSettings) -> None:
        """The trace store: Postgres (embedded when HACO_DATABASE_URL is unset), its
        migrations, the harvester, and beat for the periodic recompute."""
        self.database_url, self.embedded_pg = embedded_pg.resolve_database_url(settings)
        with connect(self.database_url) as conn:
            conn.autocommit = True
            migrate(conn)
        self.start_harvester()
        self.beat = self._spawn(beat_command(), BEAT)

    def processes(self) -> dict[str, subprocess.Popen[bytes]]:
        """The child processes by name (the servers are not among them)."""
        procs = {worker_name(zone): proc for zone, proc in self.workers.items()}
        for name, proc in ((HARVESTER, self.harvester), (BEAT, self.beat), (FLOWER, self.flower)):
            if proc is not None:
                procs[name] = proc
        return procs

    def respawn(self, name: str) -> subprocess.Popen[bytes]:
        """Start process ``name`` again with the command it was started with."""
        proc = self._spawn(self.commands[name], name)
        if name == HARVESTER:
            self.harvester = proc
        elif name == BEAT:
            self.beat = proc
        elif name == FLOWER:
            self.flower = proc
        else:
            zones = {worker_name(zone): zone for zone in self.workers}
            self.workers[zones[name]] = proc
        return proc

    def stop(self) -> None:
        extra = [p for p in (self.harvester, self.beat, self.flower) if p is not None]
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
        self.harvester = self.beat = self.flower = None
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
    flower_port: int | None = None,
) -> Stack:
    """Redis and a worker per zone; with ``with_store`` (`haco up`) also the trace store.
    Without it, a harvester still starts when a trace store is already configured. With
    ``flower_port``, Flower on it, and the workers send task events."""
    url, embedded = resolve_redis_url(settings)
    state_dir = settings.state_dir.absolute()
    stack = Stack(url, embedded, log_dir=state_dir / "logs", state_dir=state_dir)
    if flower_port is not None:
        stack.child_env["HACO_TASK_EVENTS"] = "true"
    try:
        if with_store:
            stack.start_store(settings)
        for zone in zones:
            stack.start_worker(zone, concurrency)
        if not with_store and embedded_pg.running_url(settings):
            stack.start_harvester()
        if flower_port is not None:
            stack.start_flower(flower_port)
    except BaseException:
        stack.stop()
        raise
    return stack


# -- the restart policy (pure: an injected clock, no processes)


def stop_on_signal() -> tuple[threading.Event, Callable[[], None]]:
    """An event set by SIGINT or SIGTERM (Ctrl-C, or a supervisor stopping us), and the
    function that restores the previous handlers."""
    done = threading.Event()

    def handler(signum: int, frame: object) -> None:
        done.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for s, h in previous.items():
            signal.signal(s, h)

    return done, restore


def wait_for_signal() -> None:
    """Block until SIGINT or SIGTERM (Ctrl-C, or a supervisor stopping us)."""
    done, restore = stop_on_signal()
    try:
        while not done.wait(0.5):
            pass
    finally:
        restore()
