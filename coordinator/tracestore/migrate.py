"""Schema migrations and retention of the trace store (Postgres, psycopg 3).

Migrations are plain SQL files ``NNNN_name.sql`` in ``migrations/`` at the repository root,
or in the folder passed as ``directory``, else in ``$HACO_MIGRATIONS_DIR``. :func:`migrate`
runs each in its own transaction (no BEGIN/COMMIT in the files) under an advisory lock, so
concurrent migrators apply it once, and records it with its file's SHA-256 in
``haco_schema_version``. It refuses (:class:`MigrationError`) a database newer than the
newest file, an applied migration whose file changed or is gone, and a pending file
numbered below an applied one. :func:`plan` checks the same and changes nothing.

Retention: ``members`` is range-partitioned by UTC day into tables like
``members_20250131``, made ahead by :func:`ensure_partitions` (``link_observations`` is a
view of it since migration 0006).
:func:`drop_older_than` detaches and drops whole partitions entirely before the cutoff
(cheap). The ``*_default`` partitions only catch rows outside every created partition;
their rows older than the cutoff are deleted row by row.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from importlib import resources
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from coordinator.errors import DatabaseError, InputError, MigrationError
from coordinator.tracestore.db import require_autocommit

Conn = psycopg.Connection[TupleRow]

# The SQL files ship as package data of the top-level ``migrations`` package, so an
# installed wheel finds them with no checkout and no HACO_MIGRATIONS_DIR.
DEFAULT_DIR = Path(str(resources.files("migrations")))
DIR_ENV = "HACO_MIGRATIONS_DIR"
FILE_RE = re.compile(r"(\d{4})_(\w+)\.sql", re.ASCII)
# Fixed advisory lock keys: one migrator, and one partition maintainer, at a time.
MIGRATE_LOCK, RETENTION_LOCK = 0x4841_434F_0001, 0x4841_434F_0002
# Partitioned table -> its partition key column.
PARTITIONED = {"members": "finished_at"}
VERSION_TABLE_DDL = (
    "CREATE TABLE IF NOT EXISTS haco_schema_version (version integer PRIMARY KEY, name text "
    "NOT NULL, checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
)


@contextlib.contextmanager
def _failing_as(what: str, error: type[DatabaseError] = DatabaseError) -> Iterator[None]:
    """Translate a psycopg error into ``error`` saying what failed."""
    try:
        yield
    except psycopg.Error as exc:
        raise error(f"{what}: {str(exc).strip()}") from exc


def _exists(conn: Conn, name: str) -> bool:
    row = conn.execute("SELECT to_regclass(%s)", [name]).fetchone()
    return row is not None and row[0] is not None


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path
    checksum: str
    text: str = field(repr=False)

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"


@dataclass(frozen=True)
class Applied:
    version: int
    name: str
    checksum: str
    applied_at: datetime


@dataclass(frozen=True)
class Plan:
    directory: Path
    applied: list[Applied]
    pending: list[Migration]


def migrations_dir(directory: Path | None = None) -> Path:
    return Path(directory or os.environ.get(DIR_ENV) or DEFAULT_DIR)


def _load(path: Path) -> Migration:
    found = FILE_RE.fullmatch(path.name)
    if found is None:
        raise MigrationError(f"{path}: not a migration name; expected NNNN_name.sql")
    try:
        data = path.read_bytes()
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise MigrationError(f"cannot read migration {path}: {exc}") from exc
    return Migration(int(found[1]), found[2], path, hashlib.sha256(data).hexdigest(), text)


def discover_migrations(directory: Path | None = None) -> list[Migration]:
    """The migration files, by version; MigrationError if none, or two share a version."""
    folder = migrations_dir(directory)
    found = sorted((_load(p) for p in folder.glob("*.sql")), key=lambda m: m.version)
    if not found:
        raise MigrationError(f"no migrations (NNNN_name.sql) in {folder}")
    for a, b in itertools.pairwise(found):
        if a.version == b.version:
            raise MigrationError(f"{a.path} and {b.path} share version {a.version:04d}")
    return found


def _applied(conn: Conn) -> list[Applied]:
    if not _exists(conn, "haco_schema_version"):
        return []
    query = "SELECT version, name, checksum, applied_at FROM haco_schema_version ORDER BY 1"
    return [Applied(*row) for row in conn.execute(query).fetchall()]


def _pending(files: list[Migration], applied: list[Applied], folder: Path) -> list[Migration]:
    """The files to apply; MigrationError unless every applied migration is a known,
    unchanged file and every pending one is numbered after the applied ones."""
    newest, by_version = files[-1], {m.version: m for m in files}
    for row in applied:
        known = by_version.get(row.version)
        if row.version > newest.version:
            raise MigrationError(
                f"the database is at schema version {row.version} ({row.name}), newer than "
                f"the newest migration this HACO knows, {newest.label} in {folder}: "
                "upgrade HACO, or point HACO_DATABASE_URL at the intended database"
            )
        if known is None or known.checksum != row.checksum:
            raise MigrationError(
                f"migration {row.version:04d}_{row.name}, applied at {row.applied_at} with "
                f"checksum {row.checksum[:12]}, is "
                + ("missing" if known is None else f"now {known.checksum[:12]}")
                + f" in {folder}: add a new migration instead of editing an applied one"
            )
    pending = [m for m in files if m.version not in {row.version for row in applied}]
    if pending and applied and pending[0].version < applied[-1].version:
        raise MigrationError(
            f"migration {pending[0].label} is not applied but the later "
            f"{applied[-1].version:04d} is: renumber it after the newest applied migration"
        )
    return pending


def plan(conn: Conn, directory: Path | None = None) -> Plan:
    """What :func:`migrate` would do, changing nothing (for ``--dry-run``)."""
    folder, files = migrations_dir(directory), discover_migrations(directory)
    with _failing_as("cannot read haco_schema_version"):
        applied = _applied(conn)
    return Plan(folder, applied, _pending(files, applied, folder))


def _apply_next(conn: Conn, files: list[Migration], folder: Path) -> Migration | None:
    """Apply the first pending migration, in a transaction holding the migration lock."""
    with _failing_as("cannot read haco_schema_version"), conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [MIGRATE_LOCK])
        conn.execute(VERSION_TABLE_DDL)
        pending = _pending(files, _applied(conn), folder)
        if not pending:
            return None
        m, what = pending[0], f"migration {pending[0].label} failed and was rolled back"
        with _failing_as(what, MigrationError):
            conn.execute(m.text.encode())  # bytes, no params: several statements may run
            conn.execute(
                "INSERT INTO haco_schema_version (version, name, checksum) VALUES (%s, %s, %s)",
                [m.version, m.name, m.checksum],
            )
    return m


def migrate(conn: Conn, directory: Path | None = None) -> list[Migration]:
    """Apply the pending migrations in order, each in its own transaction holding an
    advisory lock (so concurrent migrators apply each once); return those applied."""
    require_autocommit(conn, "migrate")
    folder, files = migrations_dir(directory), discover_migrations(directory)
    done: list[Migration] = []
    while (applied := _apply_next(conn, files, folder)) is not None:
        done.append(applied)
    return done


def partition_name(table: str, day: date) -> str:
    return f"{table}_{day:%Y%m%d}"


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=UTC)


def _require_tables(conn: Conn) -> None:
    for table in (t for t in PARTITIONED if not _exists(conn, t)):
        raise DatabaseError(f"the trace store has no table {table}: run `haco migrate` first")


PARTITION_STEPS = (
    "LOCK TABLE {default} IN ACCESS EXCLUSIVE MODE",  # no insert lands there meanwhile
    "CREATE TABLE {new} (LIKE {parent} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)",
    "WITH moved AS (DELETE FROM {default} WHERE {col} >= {lo} AND {col} < {hi} RETURNING *) "
    "INSERT INTO {new} SELECT * FROM moved",  # attaching would fail on rows left there
    "ALTER TABLE {parent} ATTACH PARTITION {new} FOR VALUES FROM ({lo}) TO ({hi})",
)


def _create_partition(conn: Conn, table: str, column: str, day: date) -> bool:
    """Create ``table``'s partition for ``day`` unless it exists (then return False)."""
    name, lo, hi = partition_name(table, day), _midnight(day), _midnight(day + timedelta(1))
    ids = {"new": name, "parent": table, "default": f"{table}_default", "col": column}
    args = {k: sql.Identifier(v) for k, v in ids.items()} | {"lo": lo, "hi": hi}
    with _failing_as(f"cannot create partition {name}"), conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [RETENTION_LOCK])
        if _exists(conn, name):
            return False
        for step in PARTITION_STEPS:
            conn.execute(sql.SQL(step).format(**args))
    return True


def ensure_partitions(
    conn: Conn, days_ahead: int = 7, *, start: date | None = None, dry_run: bool = False
) -> list[str]:
    """Create the missing daily partitions of members for ``start`` (default: today, UTC)
    and the ``days_ahead`` days after it; return their names (``dry_run``: only return
    them)."""
    require_autocommit(conn, "ensure_partitions")
    first = start or datetime.now(UTC).date()
    days = [first + timedelta(days=offset) for offset in range(days_ahead + 1)]
    with _failing_as("cannot inspect the trace store"):
        _require_tables(conn)
        todo = [(t, c, d) for d in days for t, c in PARTITIONED.items()]
        todo = [(t, c, d) for t, c, d in todo if not _exists(conn, partition_name(t, d))]
    made = todo if dry_run else [(t, c, d) for t, c, d in todo if _create_partition(conn, t, c, d)]
    return [partition_name(t, d) for t, _, d in made]


def expired_partitions(conn: Conn, cutoff: datetime) -> list[tuple[str, str]]:
    """(table, partition) of the daily partitions (named as by :func:`partition_name`)
    that end at or before ``cutoff``."""
    query = "SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = %s::regclass"
    expired = []
    for table in PARTITIONED:
        for (name,) in conn.execute(query, [table]).fetchall():
            found = re.fullmatch(rf"{table}_(\d{{8}})", name)
            day = datetime.strptime(found[1], "%Y%m%d").date() if found else None
            if day is not None and _midnight(day + timedelta(days=1)) <= cutoff:
                expired.append((table, name))
    return sorted(expired)


@dataclass(frozen=True)
class Retention:
    cutoff: datetime
    dropped: list[str]  # whole partitions detached and dropped (dry run: to be)
    deleted: dict[str, int]  # rows deleted (dry run: to be) per default partition


def drop_older_than(conn: Conn, cutoff: datetime, *, dry_run: bool = False) -> Retention:
    """Detach and drop the daily partitions entirely before ``cutoff`` (timezone-aware),
    each in a short transaction of its own; then delete the default partitions' rows
    older than ``cutoff``. ``dry_run`` only counts."""
    require_autocommit(conn, "drop_older_than")
    if cutoff.tzinfo is None:
        raise InputError(f"cutoff={cutoff.isoformat()} has no time zone; expected an aware one")
    with _failing_as("cannot inspect the trace store"):
        _require_tables(conn)
        dropped = expired_partitions(conn, cutoff)
    for parent, name in [] if dry_run else dropped:
        ids = {"parent": sql.Identifier(parent), "name": sql.Identifier(name)}
        with _failing_as(f"cannot drop partition {name}"), conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", [RETENTION_LOCK])
            conn.execute(sql.SQL("ALTER TABLE {parent} DETACH PARTITION {name}").format(**ids))
            conn.execute(sql.SQL("DROP TABLE {name}").format(**ids))
    deleted: dict[str, int] = {}
    for table, column in PARTITIONED.items():
        default = f"{table}_default"
        old = sql.SQL("FROM {} WHERE {} < {}").format(
            sql.Identifier(default), sql.Identifier(column), cutoff
        )
        with _failing_as(f"cannot delete rows older than {cutoff} from {default}"):
            cur = conn.execute(sql.SQL("SELECT count(*) " if dry_run else "DELETE ") + old)
            deleted[default] = int(cur.fetchall()[0][0]) if dry_run else cur.rowcount
    return Retention(cutoff, [name for _, name in dropped], deleted)
