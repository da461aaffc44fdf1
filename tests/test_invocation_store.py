"""Outcomes of submitted invocations in the store (keys.invocation_accepted, _result,
_done): the same tests on Redis (this run's own database) and on the in-memory twin."""

from __future__ import annotations

import threading

import pytest
import redis
from polling import wait_for

from coordinator.runtime.ports import OutcomeStore
from coordinator.state import keys
from coordinator.state.memstore import MemoryStore
from coordinator.state.store import RedisStore

TTL = 60.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["redis", "memory"])
def store(request: pytest.FixtureRequest) -> OutcomeStore:
    if request.param == "redis":
        return RedisStore(request.getfixturevalue("redis_db"))
    return MemoryStore(clock=FakeClock())


def test_unknown_invocation_has_no_record(store: OutcomeStore) -> None:
    assert store.invocation_record("nope") == (None, None)
    assert store.wait_outcome("nope", 0.0) is None
    assert store.wait_outcome("nope", 0.05) is None


def test_phase_then_outcome(store: OutcomeStore) -> None:
    store.set_invocation_phase("g1", "pending", TTL)
    assert store.invocation_record("g1") == ("pending", None)
    store.set_invocation_phase("g1", "running", TTL)
    assert store.invocation_record("g1") == ("running", None)
    store.save_outcome("g1", '{"x": 1}', TTL)
    assert store.invocation_record("g1") == ("running", '{"x": 1}')
    assert store.wait_outcome("g1", 0.0) == '{"x": 1}'
    assert store.wait_outcome("g1", 1.0) == '{"x": 1}'  # the done token stays


def test_every_waiter_wakes_when_the_outcome_is_saved(store: OutcomeStore) -> None:
    got: list[str | None] = []
    lock = threading.Lock()

    def wait() -> None:
        found = store.wait_outcome("g2", 30.0)
        with lock:
            got.append(found)

    threads = [threading.Thread(target=wait) for _ in range(3)]
    for t in threads:
        t.start()
    store.set_invocation_phase("g2", "running", TTL)
    store.save_outcome("g2", "done-json", TTL)
    for t in threads:
        t.join(timeout=30.0)
    assert got == ["done-json"] * 3


def test_redis_writes_every_key_with_its_ttl(redis_db: redis.Redis) -> None:
    store = RedisStore(redis_db)
    store.set_invocation_phase("g3", "pending", 120.0)
    store.save_outcome("g3", "{}", 90.0)
    for key, ttl_ms in [
        (keys.invocation_accepted("g3"), 120_000),
        (keys.invocation_result("g3"), 90_000),
        (keys.invocation_done("g3"), 90_000),
    ]:
        assert 0 < redis_db.pttl(key) <= ttl_ms
    assert store.wait_outcome("g3", 1.0) == "{}"
    assert 0 < redis_db.pttl(keys.invocation_done("g3")) <= 90_000  # BLMOVE keeps it
    assert redis_db.llen(keys.invocation_done("g3")) == 1


def test_redis_outcome_expires(redis_db: redis.Redis) -> None:
    store = RedisStore(redis_db)
    store.set_invocation_phase("g4", "running", 0.2)
    store.save_outcome("g4", "{}", 0.2)
    wait_for("the records to expire", lambda: store.invocation_record("g4") == (None, None))
    assert redis_db.exists(keys.invocation_done("g4")) == 0


def test_memory_outcome_expires_on_its_clock() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    store.set_invocation_phase("g5", "running", 10.0)
    store.save_outcome("g5", "{}", 5.0)
    clock.now += 6.0
    assert store.invocation_record("g5") == ("running", None)
    assert store.wait_outcome("g5", 0.0) is None
    clock.now += 5.0
    assert store.invocation_record("g5") == (None, None)
