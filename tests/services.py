"""The servers the test suite runs against, chosen once per pytest run: the machine's
Redis and Postgres when they answer, else embedded ones started by the product's own code
(:mod:`coordinator.services.embedded_redis`, :mod:`coordinator.services.embedded_pg`).
No test skips for a missing service: with nothing but Python, everything runs embedded.
The fixtures over this module are in ``conftest.py``; what a run used is printed at its end.

Three kinds of server, each started (or leased) on first use, released at session end:

**A Redis database of the run's own** (``redis_url``, ``redis_db``), for the stores, the
budget, the harvester …: a database number *leased* on a shared server, flushed freely.
The server is ``HACO_TEST_REDIS_URL`` if set (its database number is ignored), else the
machine's ``redis://127.0.0.1:6379`` if it answers PING, else the run's embedded Redis
(below, database :data:`EMBEDDED_DB`). On a shared server the lease is a key
``haco-test:lease:<n>`` in database :data:`LEASE_DB` (never itself leased), taken with
``SET NX`` and a TTL (:data:`LEASE_TTL_S`) by the first free ``n`` of :data:`LEASABLE`: two
concurrent runs never take the same number. Every flush renews it (a run that lost it
fails rather than flush another run's data); session end deletes it; a killed run's lease
expires. Databases 0 and 1 are never leased: they are the runtime's
(``keys.APP_DB``, ``keys.BROKER_DB``) for a ``haco up`` against that server; nor are 9 and
11, the bench scripts' defaults (bench/recompute.py, bench/ingest.py). If every number
is taken, the run falls back to its embedded Redis.

**A whole Redis server of the run's own** (``runtime_redis_url``), for tests that run
Celery workers or a ``haco up`` stack: workers use databases 0 and 1 of a server, fixed,
so these never get the machine's Redis (another run, or a developer's ``haco up``, uses
them). It is the run's embedded Redis, on a free loopback port; users flush its two
databases with :func:`flush_runtime_dbs` before they start.

**A Postgres server to create databases on** (``pg_admin_url``): ``HACO_TEST_PG_URL`` if
set, else ``postgresql://postgres@127.0.0.1:5432/test`` if it answers, else the run's
embedded Postgres (``embedded_pg_url``, started once: ``initdb`` takes a few seconds).
Each test module gets a fresh database on it (``pg_url``), dropped afterwards, so runs
never share one. Tests of the embedded server itself use ``embedded_pg_url`` too.

``HACO_TEST_SERVICES=embedded`` ignores the machine's servers (the nothing-but-Python path
without a network namespace); a URL set in ``HACO_TEST_*_URL`` that does not answer is an
error, not a fallback. Embedded servers live in a state dir from ``tempfile.mkdtemp``, not
under pytest's ``tmp_path``: as root, Postgres runs as the system user ``pgserver``,
which must traverse every parent directory, and each pytest session resets
``/tmp/pytest-of-root`` to 0700. A run killed by SIGKILL leaves its embedded servers
running (as ``haco up`` would); the state dir names them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import psycopg
import redis
from psycopg_pool import ConnectionPool
from redis.backoff import NoBackoff
from redis.retry import Retry

from bench.scratchdb import database_url
from coordinator.runtime.client import HacoClient
from coordinator.runtime.dispatch import await_answers, worker_node
from coordinator.services.embedded_pg import EmbeddedPostgres
from coordinator.services.embedded_redis import EmbeddedRedis
from coordinator.state import keys
from coordinator.state.broker import with_db
from coordinator.tracestore.db import connect, redact
from coordinator.tracestore.migrate import migrate

MACHINE_REDIS_URL = "redis://127.0.0.1:6379/0"
MACHINE_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
# Addresses where nothing listens (port 1), for tests of what a dead service does.
UNREACHABLE_REDIS_URL = "redis://127.0.0.1:1/0"
UNREACHABLE_PG_URL = "postgresql://nobody:secret@127.0.0.1:1/none"

LEASE_DB = 15
LEASABLE = tuple(n for n in range(2, LEASE_DB) if n not in (keys.APP_DB, keys.BROKER_DB, 9, 11))
LEASE_TTL_S = 900  # renewed by every flush; what a killed run blocks the number for
EMBEDDED_DB = 2  # the leased-database tests' number on the run's own embedded Redis
PROBE_TIMEOUT_S = 0.5

# KEYS[1] the lease, ARGV[1] our token, ARGV[2] the TTL in ms: 1 if we hold it (again).
_RENEW = """
local owner = redis.call('GET', KEYS[1])
if owner == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
if owner then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def quick_client(url: str) -> redis.Redis:
    """A client that fails at once rather than retrying (probes, leases)."""
    t_s, retry = PROBE_TIMEOUT_S, Retry(NoBackoff(), 0)
    return redis.Redis.from_url(url, socket_timeout=t_s, socket_connect_timeout=t_s, retry=retry)


def redis_answers(url: str) -> bool:
    try:
        with quick_client(url) as client:
            return bool(client.ping())
    except (redis.RedisError, OSError):
        return False


def pg_answers(url: str) -> bool:
    try:
        psycopg.connect(url, connect_timeout=2).close()  # libpq waits no less than 2 s
    except psycopg.Error:
        return False
    return True


@contextlib.contextmanager
def empty_database(server_url: str, stem: str) -> Iterator[str]:
    """A new, empty database on ``server_url`` (a unique name: runs never share one);
    dropped afterwards, whoever is still connected."""
    name = f"haco_{stem}_{uuid.uuid4().hex[:10]}"
    with connect(server_url) as admin:
        admin.execute(f'CREATE DATABASE "{name}"'.encode())
        try:
            yield database_url(server_url, name)
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


@contextlib.contextmanager
def fresh_database(server_url: str, stem: str) -> Iterator[str]:
    """A new database on ``server_url`` with the migrations applied; dropped afterwards."""
    with empty_database(server_url, stem) as url:
        with connect(url) as conn:
            migrate(conn)
        yield url


def flush_runtime_dbs(server_url: str) -> None:
    """Empty the two databases the runtime uses on a server (keys.APP_DB, BROKER_DB):
    call before starting workers on the run's own server, never on a shared one."""
    for db in (keys.APP_DB, keys.BROKER_DB):
        with redis.Redis.from_url(with_db(server_url, db)) as client:
            client.flushdb()


@contextlib.contextmanager
def private_state_dir(prefix: str = "haco-test-") -> Iterator[Path]:
    """A state dir for embedded servers outside pytest's basetemp (see the docstring)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class DbLease:
    """A Redis database number this run holds on a shared server (see the docstring)."""

    def __init__(self, server_url: str, db: int, token: str) -> None:
        self.server_url, self.db, self.token = server_url, db, token
        self.url = with_db(server_url, db)

    @staticmethod
    def _key(db: int) -> str:
        return f"haco-test:lease:{db}"

    @classmethod
    def take(cls, server_url: str) -> DbLease | None:
        """The first free number of LEASABLE, or None if every one is taken (or the
        server has fewer than 16 databases)."""
        token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        with quick_client(with_db(server_url, LEASE_DB)) as client:
            for db in LEASABLE:
                try:
                    if client.set(cls._key(db), token, nx=True, ex=LEASE_TTL_S):
                        return cls(server_url, db, token)
                except redis.ResponseError:  # "DB index is out of range"
                    return None
        return None

    def renew(self) -> None:
        """Extend the lease (retaking it if it expired); fail if another run holds it."""
        with quick_client(with_db(self.server_url, LEASE_DB)) as client:
            held = client.eval(_RENEW, 1, self._key(self.db), self.token, LEASE_TTL_S * 1000)
        if not held:
            raise RuntimeError(
                f"lost the lease of Redis database {self.db} on {self.server_url} to "
                "another test run: not flushing it"
            )

    def release(self) -> None:
        lease_db = with_db(self.server_url, LEASE_DB)
        with contextlib.suppress(redis.RedisError, OSError), quick_client(lease_db) as client:
            client.eval(_RELEASE, 1, self._key(self.db), self.token)


class RunServices:
    """What one pytest run uses; each server is found or started on first use."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = dict(os.environ if environ is None else environ)
        self.embedded_only = env.get("HACO_TEST_SERVICES", "") == "embedded"
        self._redis_env = env.get("HACO_TEST_REDIS_URL") or None
        self._pg_env = env.get("HACO_TEST_PG_URL") or None
        self._root: Path | None = None
        self._redis: EmbeddedRedis | None = None
        self._pg: EmbeddedPostgres | None = None
        self._lease: DbLease | None = None
        self._redis_url: str | None = None
        self._pg_admin_url: str | None = None
        self.used: dict[str, str] = {}  # what served what, for the end-of-run summary

    def _state_dir(self, name: str) -> Path:
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="haco-test-services-"))
        return self._root / name

    # -- Redis

    def runtime_redis_url(self) -> str:
        """The run's embedded Redis: a whole server (databases 0 and 1 for the runtime)."""
        if self._redis is None:
            handle = EmbeddedRedis(self._state_dir("redis"))
            handle.start()
            self._redis = handle
        assert self._redis.url is not None
        self.used.setdefault("Redis, whole server", f"embedded at {self._redis.url}")
        return self._redis.url

    def _shared_redis(self) -> str | None:
        """The shared server to lease a database on, or None to use the embedded one."""
        if self._redis_env is not None:
            if not redis_answers(self._redis_env):
                raise RuntimeError(f"HACO_TEST_REDIS_URL={self._redis_env}: no Redis answers")
            return self._redis_env
        if not self.embedded_only and redis_answers(MACHINE_REDIS_URL):
            return MACHINE_REDIS_URL
        return None

    def redis_url(self) -> str:
        """A Redis database this run has to itself."""
        if self._redis_url is None:
            shared = self._shared_redis()
            self._lease = None if shared is None else DbLease.take(shared)
            if self._lease is not None:
                self._redis_url = self._lease.url
                where = f"leased database {self._lease.db}: {redact(self._lease.url)}"
            else:
                self._redis_url = with_db(self.runtime_redis_url(), EMBEDDED_DB)
                why = "" if shared is None else f" (no free database on {shared})"
                where = f"embedded, database {EMBEDDED_DB}{why}"
            self.used["Redis, one database"] = where
        return self._redis_url

    def flush(self, client: redis.Redis) -> None:
        """Empty this run's database (after renewing its lease, on a shared server)."""
        if self._lease is not None:
            self._lease.renew()
        client.flushdb()

    # -- Postgres

    def embedded_pg_url(self) -> str:
        """The run's embedded Postgres (admin URL: user and database ``postgres``)."""
        if self._pg is None:
            handle = EmbeddedPostgres(self._state_dir("postgres"))
            handle.start()
            self._pg = handle
        assert self._pg.url is not None
        self.used.setdefault("Postgres, embedded", self._pg.url)
        return self._pg.url

    def pg_admin_url(self) -> str:
        """A Postgres server's URL to create and drop databases with."""
        if self._pg_admin_url is None:
            if self._pg_env is not None:
                if not pg_answers(self._pg_env):
                    raise RuntimeError(f"HACO_TEST_PG_URL={redact(self._pg_env)}: no answer")
                self._pg_admin_url = self._pg_env
            elif not self.embedded_only and pg_answers(MACHINE_PG_URL):
                self._pg_admin_url = MACHINE_PG_URL
            else:
                self._pg_admin_url = self.embedded_pg_url()
            self.used["Postgres, fresh databases on"] = redact(self._pg_admin_url)
        return self._pg_admin_url

    # -- the end

    def close(self) -> None:
        """Release the lease, stop the embedded servers, remove their state dir."""
        if self._lease is not None:
            self._lease.release()
            self._lease = None
        try:
            if self._pg is not None:
                self._pg.stop()
        finally:
            if self._redis is not None:
                self._redis.stop()
            if self._root is not None:
                shutil.rmtree(self._root, ignore_errors=True)
            self._pg, self._redis, self._root = None, None, None


def open_pool(url: str, timeout: float = 10.0) -> ConnectionPool:
    """A small, checked connection pool on ``url``, opened (the harvester's kind)."""
    pool = ConnectionPool(
        url, min_size=1, max_size=2, timeout=timeout, open=False,
        check=ConnectionPool.check_connection,
    )  # fmt: skip
    pool.open(wait=True, timeout=30)
    return pool


def wait_ready(client: HacoClient, zones: Sequence[str], timeout_s: float = 30.0) -> None:
    """Until the worker of every zone answers a Celery ping."""
    want = {worker_node(zone, socket.gethostname()) for zone in zones}
    seen = await_answers(client.app, want, time.monotonic() + timeout_s)
    if not want <= seen:
        raise TimeoutError(f"workers {sorted(want - seen)} did not answer a ping in {timeout_s} s")
