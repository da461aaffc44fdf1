"""The watchdog of `haco up`: notices a dead child and restarts it.

**Supervision.** While `haco up` waits for Ctrl-C, :class:`Supervisor` polls every child
(``Popen.poll()``, which also reaps it: no zombies; the embedded Postgres' postmaster,
which ``pg_ctl`` started and so is not our child, by its command line) and restarts a
dead one: the embedded Redis on the same port (its append-only file brings its data
back; every worker and caller keeps its URL and reconnects by itself), the embedded
Postgres on the same socket, a worker, the harvester, beat or Flower with the command it
was started with. The delays come from :class:`RestartPolicy` through one
:class:`Backoff` per child, a pure state machine on an injected clock: exponential from
``supervise_initial_delay_s`` up to ``supervise_max_delay_s``; a child that ran
``supervise_stable_s`` starts over from the initial delay; after
``supervise_max_restarts`` crashes in a row it is given up. Each death is one log line:
the process, its pid, its exit status or signal, the restart count and the delay. On
SIGINT/SIGTERM the loop ends first, so nothing is restarted while the stack stops.

**Status file** ``<state_dir>/supervisor.json``, rewritten atomically (a temporary file,
then a rename: a reader sees the old or the new one, never half) whenever something in it
changes, and removed when `haco up` stops cleanly (a file whose ``supervisor_pid`` is not
running is stale: `haco up` was killed)::

    {
      "version": 1,
      "supervisor_pid": 4242,              # the `haco up` process
      "state": "running",                  # "stopping" once Ctrl-C was received
      "started_at": 1764561000.5,          # Unix seconds, as every time below
      "updated_at": 1764561093.2,
      "state_dir": "/home/me/.local/state/haco",
      "services": {
        "redis": {"url": "redis://127.0.0.1:40123/0", "embedded": true},
        "postgres": {"url": "postgresql://postgres@/postgres?host=...", "embedded": true},
        "flower": {"url": "http://127.0.0.1:5555/"}
      },                                   # "postgres", "flower": null when not run
      "processes": {                       # by name: "redis", "postgres" (embedded only),
        "worker-local": {                  # "worker-<zone>", "worker-judge", "harvester",
          "kind": "worker",                # "beat", "flower"; kind: "server", "worker",
          "pid": 5151,                     # "harvester", "beat", "flower"
          "alive": true,
          "state": "running",              # "running", "waiting" (dead, restart due at
          "restarts": 1,                   # next_restart_at), "given_up" (crash loop)
          "last_exit": -9,                 # Popen's returncode (negative: the signal);
          "last_exit_reason": "killed by SIGKILL",  # null if none yet or unknown
          "last_restart_at": 1764561090.1,
          "next_restart_at": null
        }
      }
    }

URLs carry no password (redacted). The ``processes`` object is what `haco zones` reads
(restarts of ``worker-<zone>``) and `haco status` shows.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordinator.errors import HacoError
from coordinator.services.pidfile import process_cmdline
from coordinator.services.restart import Backoff, Phase, RestartPolicy, exit_reason
from coordinator.services.supervisor import POSTGRES, REDIS, Stack
from coordinator.tracestore.db import redact

STATUS_FILE, STATUS_VERSION = "supervisor.json", 1
log = logging.getLogger(__name__)


def status_path(state_dir: Path) -> Path:
    return Path(state_dir) / STATUS_FILE


def read_status(state_dir: Path) -> dict[str, Any] | None:
    """The status file's content; None if missing or unreadable."""
    try:
        data = json.loads(status_path(state_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def pid_alive(pid: object) -> bool:
    """Whether process ``pid`` runs (a zombie has no command line: not running)."""
    return isinstance(pid, int) and pid > 0 and process_cmdline(pid) != ""


def live_supervisor(state_dir: Path) -> int | None:
    """The pid of the `haco up` supervising ``state_dir``, if one runs."""
    data = read_status(state_dir)
    pid = None if data is None else data.get("supervisor_pid")
    return pid if isinstance(pid, int) and pid_alive(pid) else None


@dataclass
class _Record:
    kind: str
    backoff: Backoff
    last_exit: int | None = None
    last_exit_reason: str | None = None
    last_restart_at: float | None = None
    next_restart_at: float | None = None


class Supervisor:
    """Polls the children of ``stack`` and restarts the dead ones (module docstring).
    ``clock`` (monotonic) drives the backoff, ``wall`` stamps the status file, ``say``
    gets the one-line reports."""

    def __init__(
        self,
        stack: Stack,
        policy: RestartPolicy,
        state_dir: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        say: Callable[[str], object] = log.warning,
    ) -> None:
        self.stack, self.policy, self.clock, self.wall, self.say = stack, policy, clock, wall, say
        self.path = None if state_dir is None else status_path(state_dir)
        self.state_dir = state_dir
        self.started_at = wall()
        self.stopping = False
        self.records: dict[str, _Record] = {}
        self._written: dict[str, Any] | None = None
        self._write_failed = False

    # -- what is watched

    def _children(self) -> dict[str, tuple[str, int | None]]:
        """Name -> (kind, pid), servers first (restarted before what depends on them)."""
        out: dict[str, tuple[str, int | None]] = {}
        if self.stack.embedded is not None:
            out[REDIS] = ("server", self.stack.embedded.pid)
        if self.stack.embedded_pg is not None:
            out[POSTGRES] = ("server", self.stack.embedded_pg.pid)
        for name, proc in self.stack.processes().items():
            kind = "worker" if name.startswith("worker-") else name
            out[name] = (kind, proc.pid)
        return out

    def _exited(self, name: str) -> tuple[bool, int | None]:
        """(dead, its returncode if known); reaps a dead child."""
        if name == REDIS:
            assert self.stack.embedded is not None
            code = self.stack.embedded.poll()
            return code is not None, code
        if name == POSTGRES:
            assert self.stack.embedded_pg is not None
            return not self.stack.embedded_pg.alive(), None
        code = self.stack.processes()[name].poll()
        return code is not None, code

    def _restart(self, name: str) -> int | None:
        if name == REDIS:
            assert self.stack.embedded is not None
            self.stack.embedded.restart()
            return self.stack.embedded.pid
        if name == POSTGRES:
            assert self.stack.embedded_pg is not None
            self.stack.embedded_pg.restart()
            return self.stack.embedded_pg.pid
        return self.stack.respawn(name).pid

    # -- one pass

    def check(self) -> None:
        """Notice deaths, restart what is due (never while stopping), update the file."""
        for name, (kind, pid) in self._children().items():
            rec = self.records.get(name)
            if rec is None:
                rec = self.records[name] = _Record(kind, Backoff(self.policy, self.clock))
            if rec.backoff.phase is Phase.RUNNING:
                dead, code = self._exited(name)
                if dead:
                    rec.last_exit, rec.last_exit_reason = code, exit_reason(code)
                    self._schedule(name, rec, f"{name} (pid {pid}) {rec.last_exit_reason}")
            if rec.backoff.due() and not self.stopping:
                try:
                    new_pid = self._restart(name)
                except (HacoError, OSError) as exc:
                    first = (str(exc).splitlines() or [type(exc).__name__])[0]  # one line
                    self._schedule(name, rec, f"{name}: restart failed: {first}")
                    continue
                rec.backoff.restarted()
                rec.last_restart_at = round(self.wall(), 3)
                restarts = rec.backoff.restarts
                self.say(f"supervisor: {name} restarted (pid {new_pid}), restart {restarts}")
        try:
            self.write_status()
        except OSError as exc:  # a full disk must not take the stack down: say it, go on
            if not self._write_failed:
                self.say(f"supervisor: cannot write {self.path}: {exc}")
            self._write_failed = True
        else:
            self._write_failed = False

    def _schedule(self, name: str, rec: _Record, what: str) -> None:
        delay = rec.backoff.died()
        rec.next_restart_at = None if delay is None else round(self.wall() + delay, 3)
        if delay is None:
            self.say(
                f"supervisor: {what}; {rec.backoff.crashes - 1} restarts in a row did not "
                f"last {self.policy.stable_s:g} s: given up, {name} stays down"
            )
        else:
            self.say(f"supervisor: {what}; restart {rec.backoff.restarts + 1} in {delay:.1f} s")

    def run(self, stop: threading.Event, poll_s: float) -> None:
        """Check every ``poll_s`` until ``stop`` is set; then no more restarts."""
        try:
            self.check()
            while not stop.wait(poll_s):
                self.check()
        finally:
            self.stopping = True
            with contextlib.suppress(OSError):
                self.write_status()

    # -- the status file

    def status(self) -> dict[str, Any]:
        stack, procs = self.stack, {}
        children = self._children()
        for name, rec in self.records.items():
            b = rec.backoff
            _, pid = children.get(name, (rec.kind, None))
            next_at = rec.next_restart_at if b.phase is Phase.WAITING else None
            procs[name] = {
                "kind": rec.kind,
                "pid": pid,
                "alive": b.phase is Phase.RUNNING,
                "state": b.phase.value,
                "restarts": b.restarts,
                "last_exit": rec.last_exit,
                "last_exit_reason": rec.last_exit_reason,
                "last_restart_at": rec.last_restart_at,
                "next_restart_at": next_at,
            }
        db = stack.database_url
        return {
            "version": STATUS_VERSION,
            "supervisor_pid": os.getpid(),
            "state": "stopping" if self.stopping else "running",
            "started_at": round(self.started_at, 3),
            "state_dir": None if self.state_dir is None else str(self.state_dir),
            "services": {
                "redis": {"url": redact(stack.redis_url), "embedded": stack.embedded is not None},
                "postgres": None
                if db is None
                else {"url": redact(db), "embedded": stack.embedded_pg is not None},
                "flower": None if stack.flower_url is None else {"url": stack.flower_url},
            },
            "processes": procs,
        }

    def write_status(self) -> None:
        """Rewrite the file (atomically) if its content changed."""
        if self.path is None:
            return
        data = self.status()
        if data == self._written:
            return
        body = json.dumps({**data, "updated_at": round(self.wall(), 3)}, indent=2) + "\n"
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(body, encoding="utf-8")
        os.replace(tmp, self.path)
        self._written = data

    def remove_status(self) -> None:
        """Remove the file if it is this process's (`haco up` stopped cleanly)."""
        if self.path is None or self.state_dir is None:
            return
        data = read_status(self.state_dir)
        if data is not None and data.get("supervisor_pid") == os.getpid():
            self.path.unlink(missing_ok=True)
