"""Fixtures shared by the trace-store tests."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from coordinator.tracestore.migrate import migrate

# The machine's PostgreSQL (trust auth); each test module gets a database of its own.
PG_ADMIN_URL = os.environ.get("HACO_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture(scope="module")
def pg_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database in the machine's Postgres with the migrations applied, dropped
    when the module is done."""
    stem = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    name = f"haco_{stem}_{uuid.uuid4().hex[:10]}"
    try:
        admin = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.skip(f"no Postgres at {PG_ADMIN_URL}: {exc}")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"'.encode())
        url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                migrate(conn)
            yield url
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())
