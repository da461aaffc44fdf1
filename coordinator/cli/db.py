"""Trace-store commands of `haco`: migrate, db retention.

Both use ``HACO_DATABASE_URL``, else the embedded Postgres under ``HACO_STATE_DIR`` (one
already running, or one started for the command and stopped after it). Human-readable
lines go to stderr, a JSON summary to stdout.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import typer

from coordinator.cli.common import clean_errors, err
from coordinator.config import HacoSettings
from coordinator.errors import InputError

db_app = typer.Typer(help="The trace store (Postgres).", no_args_is_help=True)


@contextlib.contextmanager
def _database(settings: HacoSettings) -> Iterator[str]:
    """The database URL for this command; an embedded server started for it is stopped."""
    from coordinator.services.embedded_pg import resolve_database_url
    from coordinator.tracestore.db import redact

    url, handle = resolve_database_url(settings)
    try:
        err.print(f"database {redact(url)}{' (embedded)' if not settings.database_url else ''}")
        yield url
    finally:
        if handle is not None:
            handle.stop()


def _emit(summary: dict[str, Any]) -> None:
    print(json.dumps(summary, default=str, indent=2))


@clean_errors
def migrate_cmd(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan only")] = False,
) -> None:
    """Apply the pending schema migrations (migrations/*.sql) to the trace store."""
    from coordinator.tracestore.db import connect
    from coordinator.tracestore.migrate import migrate, plan

    settings = HacoSettings()
    with _database(settings) as url, connect(url) as conn:
        applied = [] if dry_run else migrate(conn)
        after = plan(conn)
    version = max((a.version for a in after.applied), default=0)
    for m in applied:
        err.print(f"applied {m.label}", highlight=False)
    for m in after.pending:
        err.print(f"would apply {m.label} ({m.path})", highlight=False)
    if not applied and not after.pending:
        err.print(f"up to date at version {version}", highlight=False)
    _emit(
        {
            "dry_run": dry_run,
            "directory": str(after.directory),
            "version": version,
            "applied": [m.label for m in applied],
            "pending": [m.label for m in after.pending],
        }
    )


@clean_errors
def retention_cmd(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Report only")] = False,
    days_ahead: Annotated[int, typer.Option(help="Daily partitions to create ahead")] = 7,
    days: Annotated[
        int | None, typer.Option(help="Keep this many days (default: HACO_RETENTION_DAYS)")
    ] = None,
) -> None:
    """Create the coming days' partitions, then drop the data older than the retention
    (whole daily partitions; rows of the default partitions one by one)."""
    from coordinator.tracestore.db import connect
    from coordinator.tracestore.migrate import drop_older_than, ensure_partitions

    settings = HacoSettings()
    keep = settings.retention_days if days is None else days
    if keep < 1 or not 0 <= days_ahead <= 366:
        raise InputError(f"--days={keep} --days-ahead={days_ahead}; expected >= 1 and 0..366")
    cutoff = datetime.now(UTC) - timedelta(days=keep)
    with _database(settings) as url, connect(url) as conn:
        created = ensure_partitions(conn, days_ahead, dry_run=dry_run)
        result = drop_older_than(conn, cutoff, dry_run=dry_run)
    verb = ("would create", "would drop") if dry_run else ("created", "dropped")
    err.print(f"{verb[0]} {len(created)} partitions, {verb[1]} {len(result.dropped)}", end="")
    err.print(f" older than {cutoff:%Y-%m-%d %H:%M} UTC; default rows: {result.deleted}")
    _emit(
        {
            "dry_run": dry_run,
            "cutoff": cutoff.isoformat(),
            "created": created,
            "dropped": result.dropped,
            "deleted": result.deleted,
        }
    )


def register_db(app: typer.Typer) -> None:
    app.command("migrate")(migrate_cmd)
    db_app.command("retention")(retention_cmd)
    app.add_typer(db_app, name="db")
