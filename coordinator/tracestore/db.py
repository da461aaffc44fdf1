"""Connections to the trace store: autocommit, with errors that name the target."""

from __future__ import annotations

import re

import psycopg
from psycopg.rows import TupleRow

from coordinator.errors import DatabaseError, InputError

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


def require_autocommit(conn: psycopg.Connection[TupleRow], who: str) -> None:
    """InputError unless ``conn`` is in autocommit mode: ``who`` commits transactions of
    its own, which inside a caller's transaction would only be savepoints."""
    if not conn.autocommit:
        raise InputError(
            f"{who} got a connection with autocommit=False; expected an autocommit "
            "connection (coordinator.tracestore.db.connect): it commits on its own"
        )
