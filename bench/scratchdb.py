"""A throwaway trace store for a benchmark: a fresh database with the migrations applied."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import psycopg

from coordinator.tracestore.migrate import migrate


@contextlib.contextmanager
def scratch_database(pg_url: str, prefix: str) -> Iterator[str]:
    """Create ``<prefix>_<random>`` beside the database of ``pg_url``, migrate it, yield
    its URL; drop it (closing its connections) on the way out."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"'.encode())
        try:
            url = pg_url.rsplit("/", 1)[0] + f"/{name}"
            with psycopg.connect(url, autocommit=True) as conn:
                migrate(conn)
            yield url
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())
