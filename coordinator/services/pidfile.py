"""The state-dir lock and the pidfile, shared by the embedded servers
(:mod:`coordinator.services.embedded_redis`, :mod:`coordinator.services.embedded_pg`).

Each server keeps its state under ``state_dir`` and serialises check-then-start there with
an exclusive ``flock`` on a lock file of its own (``redis.lock``, ``postgres.lock``), so
that concurrent ``haco`` commands start one server, never two. The lock is released when
its descriptor closes, so a process that dies holding it leaves no stale lock behind.

A :class:`Pidfile` names a running server: the embedded Redis writes a JSON record
(atomically, by rename, so no reader sees half a file); Postgres writes its own
``postmaster.pid``, which is only read and, when stale, removed. Whether a pidfile is
stale is the caller's question (a live server answers at the address it names).

Every OSError leaves as the caller's error class (``ServiceError`` for Redis,
``DatabaseError`` for Postgres), saying what failed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordinator.errors import HacoError


@contextlib.contextmanager
def failing_as(what: str, error: type[HacoError]) -> Iterator[None]:
    """Translate an OSError into ``error`` saying what failed."""
    try:
        yield
    except OSError as exc:
        raise error(f"{what}: {exc.strerror or exc}") from exc


@contextlib.contextmanager
def state_lock(state_dir: Path, lock_name: str, error: type[HacoError]) -> Iterator[None]:
    """Hold an exclusive lock on ``state_dir/lock_name`` (creating the dir), blocking
    until it is free: serialises check-then-start across processes sharing ``state_dir``."""
    with failing_as(f"cannot use state dir {state_dir}", error):
        Path(state_dir).mkdir(parents=True, exist_ok=True)
        fd = os.open(Path(state_dir) / lock_name, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


@dataclass(frozen=True)
class Pidfile:
    """The file naming a running server's process; ``error`` is what an OSError becomes."""

    path: Path
    error: type[HacoError]

    def exists(self) -> bool:
        return self.path.exists()

    def read_json(self) -> dict[str, Any] | None:
        """The JSON object in the file; None if missing or unreadable (both mean stale)."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def read_lines(self) -> list[str] | None:
        """The file's lines (``postmaster.pid``'s format); None if it cannot be read."""
        try:
            return self.path.read_text(encoding="utf-8").splitlines()
        except (OSError, ValueError):
            return None

    def write_json(self, data: dict[str, Any]) -> None:
        """Write ``data`` by rename: a reader sees the old file or the new one, never half."""
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        with failing_as(f"cannot write pidfile {self.path}", self.error):
            tmp.write_text(json.dumps(data) + "\n", encoding="utf-8")
            os.replace(tmp, self.path)

    def remove(self, what: str = "pidfile") -> None:
        """Remove the file if it is there."""
        with failing_as(f"cannot remove {what} {self.path}", self.error):
            self.path.unlink(missing_ok=True)


def process_cmdline(pid: int) -> str:
    """The command line of process ``pid`` (arguments joined by NULs), or "" if it is gone
    or unreadable (Linux /proc)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace")
    except OSError:
        return ""
