"""Connections to the trace store: autocommit, with errors that name the target."""

from __future__ import annotations

import re

import psycopg
from psycopg.rows import TupleRow

from coordinator.errors import DatabaseError

CONNECT_TIMEOUT_S = 10  # a reachable server answers at once; this bounds a dead one


def redact(url: str) -> str:
    """``url`` without its password (URI or key=value form), fit for messages."""
    url = re.sub(r"(://[^/:@]*:)[^/@]*@", r"\1***@", url)
    return re.sub(r"(password\s*=\s*)\S+", r"\1***", url)


def connect(url: str, timeout_s: int = CONNECT_TIMEOUT_S) -> psycopg.Connection[TupleRow]:
    """An autocommit connection, which the caller closes (``with connect(url) as conn``).
    DatabaseError names the target, without its password."""
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=timeout_s)
    except psycopg.Error as exc:
        why = " ".join(str(exc).split())  # libpq's message spans lines
        raise DatabaseError(f"cannot connect to Postgres at {redact(url)}: {why}") from exc
