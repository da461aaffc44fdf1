"""A throwaway trace store for a benchmark: a fresh database with the migrations applied."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import make_conninfo

from coordinator.tracestore.migrate import migrate


@contextlib.contextmanager
def scratch_database(pg_url: str, prefix: str) -> Iterator[str]:
    """Create ``<prefix>_<random>`` beside the database of ``pg_url``, migrate it, yield
    its URL; drop it (closing its connections) on the way out."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"'.encode())
        try:
            url = database_url(pg_url, name)
            with psycopg.connect(url, autocommit=True) as conn:
                migrate(conn)
            yield url
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


def database_url(server_url: str, dbname: str) -> str:
    """``server_url`` (a URL or key=value conninfo) pointed at database ``dbname``. A URL
    keeps its query: an embedded server's socket directory travels there (``?host=``)."""
    parts = urlsplit(server_url)
    if parts.scheme in ("postgres", "postgresql"):
        return urlunsplit(parts._replace(path=f"/{dbname}"))
    return make_conninfo(server_url, dbname=dbname)
