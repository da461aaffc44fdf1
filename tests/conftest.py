"""Fixtures shared by the suite: the Redis and Postgres servers of this run
(tests/services.py explains how they are chosen and why)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import psycopg
import pytest
import redis
from psycopg_pool import ConnectionPool
from services import RunServices, fresh_database, open_pool

from coordinator.runtime.ports import RuntimeStore
from coordinator.state.memstore import MemoryStore
from coordinator.state.store import RedisStore

_SERVICES = pytest.StashKey[RunServices]()
_STATE_DIR = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_SERVICES] = RunServices()  # probes and starts nothing until first use
    # No test may use the real state dir (the user's, where a developer's `haco up`
    # runs: coordinator.config.default_state_dir): the run gets one of its own, which
    # every process it starts inherits. Tests that start services give their own.
    if not os.environ.get("HACO_STATE_DIR"):
        state = tempfile.mkdtemp(prefix="haco-test-state-")
        config.stash[_STATE_DIR] = state
        os.environ["HACO_STATE_DIR"] = state


def pytest_unconfigure(config: pytest.Config) -> None:
    services = config.stash.get(_SERVICES, None)
    state = config.stash.get(_STATE_DIR, None)
    try:
        if services is not None:
            services.close()
    finally:
        if state is not None:
            os.environ.pop("HACO_STATE_DIR", None)
            shutil.rmtree(state, ignore_errors=True)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    services = terminalreporter.config.stash.get(_SERVICES, None)
    if services is not None and services.used:
        terminalreporter.write_sep("-", "services used")
        for role, where in services.used.items():
            terminalreporter.write_line(f"{role}: {where}")


@pytest.fixture(scope="session")
def run_services(pytestconfig: pytest.Config) -> RunServices:
    return pytestconfig.stash[_SERVICES]


@pytest.fixture(scope="session")
def redis_url(run_services: RunServices) -> str:
    """The URL of a Redis database this run has to itself (flush it with ``redis_db``)."""
    return run_services.redis_url()


@pytest.fixture(params=["redis", "memory"])
def store(request: pytest.FixtureRequest) -> RuntimeStore:
    """A runtime store on each backend: Redis (this run's database) and in memory; a
    test module may override it."""
    if request.param == "redis":
        return RedisStore(request.getfixturevalue("redis_db"))
    return MemoryStore()


@pytest.fixture
def redis_db(run_services: RunServices, redis_url: str) -> Iterator[redis.Redis]:
    """A client (bytes in, bytes out) on this run's Redis database, empty at the start
    and flushed again at the end."""
    client = redis.Redis.from_url(redis_url)
    try:
        run_services.flush(client)
        yield client
        run_services.flush(client)
    finally:
        client.close()


@pytest.fixture(scope="session")
def runtime_redis_url(run_services: RunServices) -> str:
    """A whole Redis server of this run's own, for Celery workers and `haco up` stacks
    (databases keys.APP_DB and keys.BROKER_DB: empty them with flush_runtime_dbs)."""
    return run_services.runtime_redis_url()


@pytest.fixture(scope="session")
def pg_admin_url(run_services: RunServices) -> str:
    """A Postgres server to create databases on (the machine's, or the embedded one)."""
    return run_services.pg_admin_url()


@pytest.fixture(scope="session")
def embedded_pg_url(run_services: RunServices) -> str:
    """This run's embedded Postgres, whichever server ``pg_admin_url`` chose."""
    return run_services.embedded_pg_url()


@pytest.fixture(scope="module")
def pg_url(request: pytest.FixtureRequest, pg_admin_url: str) -> Iterator[str]:
    """A fresh database with the migrations applied, for the module; dropped after it."""
    stem = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    with fresh_database(pg_admin_url, stem) as url:
        yield url


# The trace-store suites (harvester, recompute, outcomes) share these three.
@pytest.fixture
def r(redis_db: redis.Redis) -> redis.Redis:
    return redis_db


@pytest.fixture
def db(pg_url: str) -> Iterator[str]:
    """The module's database, emptied of every trace-store row before the test."""
    with psycopg.connect(pg_url) as conn:
        conn.execute("TRUNCATE members, invocations, profile_snapshots")
    yield pg_url


@pytest.fixture
def pool(db: str) -> Iterator[ConnectionPool]:
    p = open_pool(db)
    yield p
    p.close()
