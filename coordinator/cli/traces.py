"""Trace store commands of `haco`: harvester, traces tail, traces export."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError
from rich.table import Table

from coordinator.cli.common import clean_errors, err, show
from coordinator.config import HacoSettings
from coordinator.errors import DatabaseError, InputError, StoreError
from coordinator.state import keys
from coordinator.state.broker import with_db
from schemas.models import MemberReport

if TYPE_CHECKING:
    import psycopg
    import redis

traces_app = typer.Typer(help="The trace store: recent traces and exports.", no_args_is_help=True)

POOL_TIMEOUT_S = 10.0  # how long a batch waits for a connection before backing off
EXPORT_SQL = "SELECT * FROM members WHERE finished_at >= %s ORDER BY finished_at, member_id"


class Source(StrEnum):
    DB = "db"  # the trace store (what the harvester committed)
    STREAM = "stream"  # the trace stream (what is not harvested yet)


class ExportFormat(StrEnum):
    CSV = "csv"
    JSONL = "jsonl"


@contextlib.contextmanager
def _db(what: str) -> Iterator[psycopg.Connection[Any]]:
    import psycopg

    from coordinator.services import embedded_pg

    url = embedded_pg.trace_store_url(HacoSettings())
    try:
        with psycopg.connect(url, connect_timeout=10) as conn:
            yield conn
    except psycopg.Error as exc:
        raise DatabaseError(f"cannot {what}: {str(exc).strip()}") from exc


def _redis(settings: HacoSettings) -> redis.Redis:
    import redis

    from coordinator.runtime.client import service_url

    return redis.Redis.from_url(with_db(service_url(settings), keys.APP_DB))


@clean_errors
def harvester_cmd(
    consumer: Annotated[
        str | None, typer.Option(help="Consumer name in the group (default: host-pid)")
    ] = None,
) -> None:
    """Harvest the trace stream into Postgres until SIGINT or SIGTERM."""
    from psycopg_pool import ConnectionPool

    from coordinator.services import embedded_pg
    from coordinator.state.lean import close_lean
    from coordinator.tracestore.harvester import Harvester
    from coordinator.tracestore.harvestgc import collected_on_timer

    settings = HacoSettings()
    url = embedded_pg.trace_store_url(settings)
    client = _redis(settings)
    name = consumer or f"{socket.gethostname()}-{os.getpid()}"
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=logging.INFO, format=fmt)
    stop = threading.Event()
    handlers = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    pool = ConnectionPool(
        url,
        min_size=1,
        max_size=2,
        timeout=POOL_TIMEOUT_S,
        open=False,
        check=ConnectionPool.check_connection,
        name="haco-harvester",
    )
    try:
        with pool:  # opens without waiting: Postgres may come up later
            err.print(f"harvester {name}: group {settings.harvest_group}, Ctrl-C to stop")
            gc_every_s, max_young = settings.harvest_gc_every_s, settings.harvest_gc_max_young
            with collected_on_timer(gc_every_s, max_young):
                Harvester(client, pool, settings, name).run(stop)
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
        close_lean(client)  # the harvester's acknowledgements' own connections
        client.close()


def _stream_rows(settings: HacoSettings, n: int) -> list[dict[str, Any]]:
    import redis

    client = _redis(settings)
    try:
        entries: Any = client.xrevrange(keys.TRACES, count=n)
    except redis.RedisError as exc:
        raise StoreError(f"redis failed to read {keys.TRACES}: {exc}") from exc
    finally:
        client.close()
    rows = []
    for entry_id, fields in reversed(entries):
        if keys.VERDICT_FIELD.encode() in fields:
            continue  # a group's verdict (stored in invocations), not a member's trace
        raw = fields.get(keys.REPORT_FIELD.encode(), b"")
        try:
            trace = MemberReport.model_validate_json(raw).trace.model_dump(mode="json")
        except ValidationError as exc:
            trace = {"error": f"not a valid report: {exc.error_count()} problems"}
        rows.append({"stream_id": entry_id.decode(), **trace})
    return rows


def _db_rows(n: int) -> list[dict[str, Any]]:
    from psycopg.rows import dict_row

    query = "SELECT * FROM members ORDER BY finished_at DESC LIMIT %s"
    with _db("read recent traces") as conn, conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query, [n]).fetchall()
    return [
        {k: v.isoformat() if isinstance(v, datetime) else v for k, v in row.items()}
        for row in reversed(rows)
    ]


@traces_app.command("tail")
@clean_errors
def tail_cmd(
    n: Annotated[int, typer.Option("--n", "-n", help="How many traces")] = 20,
    source: Annotated[Source, typer.Option(help="db: stored; stream: not yet harvested")] = (
        Source.DB
    ),
) -> None:
    """The last N traces, oldest first: a table on stderr, JSON lines on stdout."""
    if n < 1:
        raise InputError(f"--n={n}; expected at least 1")
    settings = HacoSettings()
    rows = _stream_rows(settings, n) if source is Source.STREAM else _db_rows(n)
    t = Table(title=f"last {len(rows)} traces ({source.value})")
    cols = ("member_id", "group_id", "candidate_id", "zone", "status", "latency_s", "tokens_out")
    for c in cols:
        t.add_column(c)
    for row in rows:
        t.add_row(*(str(row.get(c, "")) for c in cols))
    show(t)
    for row in rows:
        print(json.dumps(row, default=str))


def parse_since(text: str) -> datetime:
    """ISO 8601; a time without a zone is UTC."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError as exc:
        raise InputError(f"--since={text!r}: expected ISO 8601, e.g. 2025-01-31T12:00Z") from exc
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _export(
    conn: psycopg.Connection[Any], since: datetime, fmt: ExportFormat, out: IO[bytes]
) -> int:
    rows = 0
    if fmt is ExportFormat.CSV:
        query = f"COPY ({EXPORT_SQL}) TO STDOUT WITH (FORMAT csv, HEADER)"
        with conn.cursor() as cur, cur.copy(query.encode(), [since]) as copy:
            for data in copy:
                out.write(data)
                rows += bytes(data).count(b"\n")
        return max(0, rows - 1)  # the header; a quoted newline in a reason overcounts
    json_sql = f"SELECT row_to_json(m)::text FROM ({EXPORT_SQL}) m"
    with conn.cursor(name="haco_export") as cur:
        cur.itersize = 5000
        cur.execute(json_sql.encode(), [since])
        for (line,) in cur:
            out.write(line.encode() + b"\n")
            rows += 1
    return rows


@traces_app.command("export")
@clean_errors
def export_cmd(
    since: Annotated[str, typer.Option(help="ISO 8601: members finished at or after it")],
    fmt: Annotated[ExportFormat, typer.Option("--format", help="csv or jsonl")] = (
        ExportFormat.JSONL
    ),
    out_file: Annotated[Path | None, typer.Option("--out", help="File (default: stdout)")] = None,
) -> None:
    """Export stored member traces from Postgres, oldest first."""
    when = parse_since(since)
    try:
        sink = out_file.open("wb") if out_file is not None else None
    except OSError as exc:
        raise InputError(f"--out={out_file}: {exc.strerror or exc}") from exc
    with _db("export traces") as conn, sink or contextlib.nullcontext(sys.stdout.buffer) as out:
        n = _export(conn, when, fmt, out)
    err.print(f"exported {n} traces finished since {when.isoformat()} ({fmt.value})")


def register_traces(app: typer.Typer) -> None:
    app.command("harvester")(harvester_cmd)
    app.add_typer(traces_app, name="traces")
