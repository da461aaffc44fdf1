"""Migrations, retention and the embedded Postgres, against real servers (tests/services.py):
a fresh database per test, dropped after it, on the run's Postgres (the machine's, or the
embedded one) and on the run's embedded server; the embedded server's own lifecycle on
servers the tests start in temporary state dirs. No mocks."""

from __future__ import annotations

import os
import pwd
import shutil
import threading
import time
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from polling import wait_for
from psycopg import errors as pg_errors
from psycopg import sql
from services import UNREACHABLE_PG_URL, empty_database, private_state_dir
from typer.testing import CliRunner

from coordinator.cli.main import app
from coordinator.config import HacoSettings
from coordinator.errors import DatabaseError, InputError, MigrationError
from coordinator.services.embedded_pg import (
    EmbeddedPostgres,
    data_dir_path,
    discover,
    resolve_database_url,
)
from coordinator.tracestore.db import connect
from coordinator.tracestore.migrate import (
    DEFAULT_DIR,
    MIGRATE_LOCK,
    discover_migrations,
    drop_older_than,
    ensure_partitions,
    migrate,
    partition_name,
    plan,
)

SHIPPED = [
    "0001_traces",
    "0002_verdicts",
    "0003_endpoint_failures",
    "0004_winner_rule",
    "0005_dependence",
    "0006_links_from_members",
]
TABLES = {"invocations", "members", "profile_snapshots"}
VIEWS = {"link_observations"}
TIMEOUT_S = 60.0


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A state dir outside pytest's basetemp (tests/services.py says why)."""
    with private_state_dir("haco-test-pg-") as path:
        yield path


@pytest.fixture(params=["external", "embedded"])
def db(request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of a fresh, empty database on the run's Postgres (given by URL, as
    HACO_DATABASE_URL gives one: the machine's, or else the embedded one) or on the run's
    embedded server."""
    fixture = "embedded_pg_url" if request.param == "embedded" else "pg_admin_url"
    with empty_database(request.getfixturevalue(fixture), "test") as url:
        yield url


@pytest.fixture
def migrations(tmp_path: Path) -> Path:
    """A copy of the shipped migrations that a test may add to or edit."""
    folder = tmp_path / "migrations"
    shutil.copytree(DEFAULT_DIR, folder)
    return folder


def tables(conn: psycopg.Connection[Any]) -> set[str]:
    rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    return {str(name) for (name,) in rows.fetchall()}


def views(conn: psycopg.Connection[Any]) -> set[str]:
    rows = conn.execute("SELECT viewname FROM pg_views WHERE schemaname = 'public'")
    return {str(name) for (name,) in rows.fetchall()}


def versions(conn: psycopg.Connection[Any]) -> list[tuple[int, str, str]]:
    query = "SELECT version, name, checksum FROM haco_schema_version ORDER BY version"
    return [(int(v), str(n), str(c)) for v, n, c in conn.execute(query).fetchall()]


def insert_member(conn: psycopg.Connection[Any], member_id: str, at: datetime, **cols: Any) -> None:
    row: dict[str, Any] = {
        "member_id": member_id,
        "group_id": "g1",
        "candidate_id": "coder-us",
        "role": "coder",
        "zone": "us",
        "caller_zone": "eu",
        "model": "m",
        "rank": 0,
        "started_at": at - timedelta(seconds=1),
        "finished_at": at,
        "status": "succeeded",
        "latency_s": 1.0,
        "stream_id": "1-0",
    } | cols
    names = ", ".join(row)
    marks = ", ".join(["%s"] * len(row))
    conn.execute(f"INSERT INTO members ({names}) VALUES ({marks})".encode(), list(row.values()))


def noon(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, 12, tzinfo=UTC)


def test_apply_on_empty_database_creates_tables_with_checks(db: str) -> None:
    with connect(db) as conn:
        applied = migrate(conn)
        assert [m.label for m in applied] == SHIPPED
        assert TABLES | {"haco_schema_version"} <= tables(conn)
        assert "members_default" in tables(conn) and views(conn) >= VIEWS
        shipped = discover_migrations()
        assert versions(conn) == [(m.version, m.name, m.checksum) for m in shipped]
        insert_member(conn, "ok", datetime.now(UTC))
        with pytest.raises(pg_errors.CheckViolation):
            insert_member(conn, "bad", datetime.now(UTC), status="exploded")
        with pytest.raises(pg_errors.CheckViolation):
            conn.execute("INSERT INTO invocations (group_id, role, state) VALUES ('g', 'r', 'x')")
        with pytest.raises(pg_errors.CheckViolation):
            insert_member(conn, "neg", datetime.now(UTC), latency_s=-1.0)


def test_apply_twice_is_a_no_op(db: str) -> None:
    with connect(db) as conn:
        migrate(conn)
        before = (tables(conn), versions(conn))
        assert migrate(conn) == []
        assert (tables(conn), versions(conn)) == before
        assert plan(conn).pending == []


def test_newer_database_is_refused(db: str) -> None:
    with connect(db) as conn:
        migrate(conn)
        conn.execute("INSERT INTO haco_schema_version VALUES (9999, 'future', 'x', now())")
        for attempt in (migrate, plan):
            with pytest.raises(MigrationError, match=r"9999.*newer.*0006_links_from_members"):
                attempt(conn)


def test_changed_checksum_is_refused(db: str, migrations: Path) -> None:
    with connect(db) as conn:
        migrate(conn, migrations)
        path = migrations / "0001_traces.sql"
        path.write_text(path.read_text(encoding="utf-8") + "\n-- edited\n", encoding="utf-8")
        with pytest.raises(MigrationError, match=r"0001_traces.*add a new migration"):
            migrate(conn, migrations)


def test_dry_run_lists_pending_without_applying(db: str, migrations: Path) -> None:
    with connect(db) as conn:
        first = plan(conn, migrations)
        assert [m.label for m in first.pending] == SHIPPED and first.applied == []
        assert tables(conn) == set()  # not even the version table
        migrate(conn, migrations)
        (migrations / "0090_extra.sql").write_text("CREATE TABLE extra (id int);\n")
        second = plan(conn, migrations)
        assert [m.label for m in second.pending] == ["0090_extra"]
        assert [a.version for a in second.applied] == [1, 2, 3, 4, 5, 6]
        assert "extra" not in tables(conn)


def test_failed_migration_rolls_back_and_out_of_order_is_refused(db: str, migrations: Path) -> None:
    (migrations / "0091_broken.sql").write_text("CREATE TABLE half (id int);\nSELECT 1/0;\n")
    with connect(db) as conn:
        with pytest.raises(MigrationError, match="0091_broken"):
            migrate(conn, migrations)
        assert "half" not in tables(conn)
        assert [v for v, _, _ in versions(conn)] == [1, 2, 3, 4, 5, 6]  # each committed on its own
        (migrations / "0091_broken.sql").write_text("CREATE TABLE half (id int);\n")
        assert [m.label for m in migrate(conn, migrations)] == ["0091_broken"]
        (migrations / "0090_late.sql").write_text("CREATE TABLE late (id int);\n")
        with pytest.raises(MigrationError, match=r"0090_late.*0091"):
            migrate(conn, migrations)


def test_concurrent_migrators_apply_once(db: str, migrations: Path) -> None:
    (migrations / "0090_extra.sql").write_text("CREATE TABLE extra (id int);\n")
    results: dict[int, list[str]] = {}
    failures: list[BaseException] = []

    def migrator(i: int) -> None:
        try:
            with connect(db) as conn:
                results[i] = [m.label for m in migrate(conn, migrations)]
        except BaseException as exc:
            failures.append(exc)

    with connect(db) as holder:
        # Hold the migration lock so that both migrators are provably waiting on it at once.
        holder.execute("SELECT pg_advisory_lock(%s)", [MIGRATE_LOCK])
        threads = [threading.Thread(target=migrator, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        waiting = (
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND "
            "database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )

        def queued() -> bool:
            return bool(holder.execute(waiting).fetchall()[0][0] >= 2)

        wait_for("both migrators to queue on the lock", queued, TIMEOUT_S, interval_s=0.01)
        holder.execute("SELECT pg_advisory_unlock(%s)", [MIGRATE_LOCK])
        for t in threads:
            t.join(TIMEOUT_S)
        assert not failures, failures
        # Each migration applied by exactly one of them (either may take the second).
        applied = sorted(label for labels in results.values() for label in labels)
        assert len(results) == 2 and applied == [*SHIPPED, "0090_extra"]
        assert [v for v, _, _ in versions(holder)] == [1, 2, 3, 4, 5, 6, 90]


def test_0006_keeps_a_stores_link_observations_readable(db: str, migrations: Path) -> None:
    """A store at 0005 holds link rows, some in a daily partition: 0006 drops the table
    with its partitions, and the view shows the same observations, from the members."""
    later = migrations / "0006_links_from_members.sql"
    text = later.read_text()
    later.unlink()
    at, day = noon(datetime.now(UTC).date()), datetime.now(UTC).date()
    link_cols = "member_id, link_id, observed_at, bytes, lost, transfer_s, rtt_s, leg"
    read = f"SELECT {link_cols} FROM link_observations ORDER BY member_id"
    with connect(db) as conn:
        migrate(conn, migrations)
        part = partition_name("link_observations", day)
        bounds = [sql.Literal(at + timedelta(hours=h)) for h in (-12, 12)]
        ddl = "CREATE TABLE {} PARTITION OF link_observations FOR VALUES FROM ({}) TO ({})"
        conn.execute(sql.SQL(ddl).format(sql.Identifier(part), *bounds))
        rows = [("a", 800, 0.02, 8e3, False), ("b", 0, None, None, True)]
        for mid, sent, rtt, bw, lost in rows:
            insert_member(conn, mid, at, bytes_sent=sent, rtt_s=rtt, bandwidth_bps=bw, lost=lost)
            conn.execute(
                f"INSERT INTO link_observations ({link_cols}) VALUES "
                "(%s, 'eu->us', %s, %s, %s, %s, %s, 0)".encode(),
                [mid, at, sent, lost, sent / bw if bw else None, rtt],
            )
        insert_member(conn, "c", at)  # records no transmission: no link row
        before = conn.execute(read.encode()).fetchall()
        assert part in tables(conn) and [r[0] for r in before] == ["a", "b"]
        later.write_text(text)
        assert [m.label for m in migrate(conn, migrations)] == ["0006_links_from_members"]
        assert conn.execute(read.encode()).fetchall() == before
        assert part not in tables(conn) and "link_observations" in views(conn)


def test_retention_drops_only_old_partitions_and_default_rows(db: str) -> None:
    today = datetime.now(UTC).date()
    with connect(db) as conn:
        migrate(conn)
        created = ensure_partitions(conn, 3, start=today - timedelta(days=3))
        assert len(created) == 4
        assert ensure_partitions(conn, 3, start=today - timedelta(days=3)) == []  # idempotent
        days = [today - timedelta(days=d) for d in (3, 2, 1, 0)]
        for day in days:
            insert_member(conn, f"m{day:%d}", noon(day), bytes_sent=100)
        ancient, future = noon(today - timedelta(days=10)), noon(today + timedelta(days=30))
        for when, tag in ((ancient, "ancient"), (future, "future")):  # default partitions
            insert_member(conn, tag, when, bytes_sent=100)
        cutoff = noon(today - timedelta(days=2)) + timedelta(hours=1)
        dry = drop_older_than(conn, cutoff, dry_run=True)
        old = [partition_name("members", days[0])]
        assert dry.dropped == old
        assert dry.deleted == {"members_default": 1}
        assert partition_name("members", days[0]) in tables(conn)

        done = drop_older_than(conn, cutoff)
        assert done.dropped == old and done.deleted == dry.deleted
        assert partition_name("members", days[0]) not in tables(conn)
        # The partition holding the cutoff stays whole: retention is by day. The link
        # view shows what is left of the members.
        kept = {f"m{day:%d}" for day in days[1:]} | {"future"}
        for table in ("members", "link_observations"):
            rows = conn.execute(f"SELECT member_id FROM {table}".encode()).fetchall()
            assert {str(r[0]) for r in rows} == kept
        again = drop_older_than(conn, cutoff)
        assert again.dropped == [] and set(again.deleted.values()) == {0}


def test_refuses_a_transaction_and_a_naive_cutoff(db: str) -> None:
    with psycopg.connect(db) as conn:  # not autocommit: its transactions would be savepoints
        for call in (migrate, ensure_partitions):
            with pytest.raises(InputError, match=rf"{call.__name__} .*autocommit=False"):
                call(conn)
    with connect(db) as conn:
        migrate(conn)
        with pytest.raises(InputError, match=r"cutoff=2025-01-31T00:00:00 has no time zone"):
            drop_older_than(conn, datetime(2025, 1, 31))  # naive: no tzinfo


def test_new_partition_takes_its_rows_from_the_default_partition(db: str) -> None:
    day = datetime.now(UTC).date() + timedelta(days=40)
    with connect(db) as conn:
        migrate(conn)
        insert_member(conn, "early", noon(day))
        assert ensure_partitions(conn, 0, start=day, dry_run=True) == [
            partition_name("members", day)
        ]
        ensure_partitions(conn, 0, start=day)
        query = "SELECT tableoid::regclass::text FROM members WHERE member_id = 'early'"
        assert conn.execute(query).fetchall() == [(partition_name("members", day),)]


def test_retention_needs_the_migrations(db: str) -> None:
    with connect(db) as conn, pytest.raises(DatabaseError, match="haco migrate"):
        ensure_partitions(conn)


def test_cli_migrate_and_retention(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HACO_DATABASE_URL", db)
    runner = CliRunner()
    dry = runner.invoke(app, ["migrate", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert '"pending": [\n    "0001_traces",\n    "0002_verdicts"' in dry.stdout
    assert "would apply" in dry.stderr
    real = runner.invoke(app, ["migrate"])
    assert real.exit_code == 0, real.output
    assert '"version": 6' in real.stdout and "applied 0006_links_from_members" in real.stderr
    again = runner.invoke(app, ["migrate"])
    assert "up to date at version 6" in again.stderr
    ret = runner.invoke(app, ["db", "retention", "--days-ahead", "1"])
    assert ret.exit_code == 0, ret.output
    assert f'"{partition_name("members", datetime.now(UTC).date())}"' in ret.stdout


def test_cli_reports_a_bad_database_cleanly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HACO_DATABASE_URL", UNREACHABLE_PG_URL)  # password: secret
    res = CliRunner().invoke(app, ["migrate"])
    assert res.exit_code == 1 and res.stdout == ""
    assert "error: cannot connect to Postgres at postgresql://nobody:***@" in res.stderr
    assert "secret" not in res.stderr and "Traceback" not in res.output


# ---- The embedded server -----------------------------------------------------------------


def test_embedded_start_discover_stop_restart(state_dir: Path) -> None:
    server = EmbeddedPostgres(state_dir)
    try:
        url = server.start()
        assert server.data_dir == state_dir / "postgres" == data_dir_path(state_dir)
        assert (server.data_dir / "PG_VERSION").read_text().strip() == "18"
        with connect(url) as conn:
            row = conn.execute("SELECT current_setting('data_directory')").fetchall()
            assert Path(row[0][0]) == server.data_dir.resolve()
            conn.execute("CREATE TABLE kept (id int)")
        if os.geteuid() == 0:  # Postgres refuses root: pgserver runs it as its own user
            assert server.data_dir.stat().st_uid == pwd.getpwnam("pgserver").pw_uid
        assert discover(state_dir) == url
        with pytest.raises(DatabaseError, match="already running"):
            EmbeddedPostgres(state_dir).start()
        server.stop()
        assert discover(state_dir) is None and server.url is None
        server.stop()  # repeatable
        with EmbeddedPostgres(state_dir) as again, connect(str(again.url)) as conn:
            assert "kept" in tables(conn)  # the data survive a stop
    finally:
        server.stop()


def test_stale_pidfile_of_a_recycled_pid_is_cleared(state_dir: Path) -> None:
    with EmbeddedPostgres(state_dir) as server:
        pidfile = server.data_dir / "postmaster.pid"
    # Our own pid is alive but is not a postmaster: what a pid recycled after a reboot is.
    data = server.data_dir
    pidfile.write_text(f"{os.getpid()}\n{data}\n{int(time.time())}\n5432\n{data}\n\n0 0\nready\n")
    assert discover(state_dir) is None
    with EmbeddedPostgres(state_dir) as server:
        assert server.pid != os.getpid() and discover(state_dir) == server.url


def test_resolve_database_url(state_dir: Path) -> None:
    external = HacoSettings(database_url="postgresql://x@h/db", state_dir=state_dir / "unused")
    assert resolve_database_url(external) == ("postgresql://x@h/db", None)
    assert not (state_dir / "unused").exists()
    settings = HacoSettings(database_url=None, state_dir=state_dir)
    url, handle = resolve_database_url(settings)
    try:
        assert handle is not None and handle.url == url
        assert resolve_database_url(settings) == (url, None)  # shared, not a second server
    finally:
        if handle is not None:
            handle.stop()


def test_cli_migrate_on_the_embedded_server(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HACO_DATABASE_URL", raising=False)
    monkeypatch.setenv("HACO_STATE_DIR", str(state_dir))
    runner = CliRunner()
    first = runner.invoke(app, ["migrate"])
    assert first.exit_code == 0, first.output
    assert "(embedded)" in first.stderr and "applied 0006_links_from_members" in first.stderr
    assert discover(state_dir) is None  # the server started for the command was stopped
    second = runner.invoke(app, ["migrate"])
    assert "up to date at version 6" in second.stderr
