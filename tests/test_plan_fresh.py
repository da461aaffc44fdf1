"""Planning on a fresh view (HacoSettings.plan_view_fresh_s): a view read within that
long is planned on again with no read (coordinator.state.profilecache), and the group is
then opened, and the budget credited, in the round trip that sends its members
(open_send.lua through CeleryDispatcher, or GroupOpening.open first elsewhere). A
failure the coordinator sees makes its role's next view a read.

Real Redis throughout; the in-memory store reads on every call (a read costs nothing
there), which its own test shows.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import redis
from runtime_helpers import ROLE, ScriptedBackend, Step, invocation, small_pool
from services import flush_runtime_dbs

from coordinator.config import HacoSettings
from coordinator.core.evidence import PoolMember, build_view
from coordinator.core.methods import PoolView
from coordinator.core.params import ProfileSettings
from coordinator.core.policy import CandidateArrays
from coordinator.core.profiles import CandidateObservation
from coordinator.errors import AllFailedError
from coordinator.runtime.coordinator import Coordinator
from coordinator.runtime.dispatch import CeleryDispatcher, ThreadDispatcher, sending_app
from coordinator.runtime.viewing import Views
from coordinator.state import keys
from coordinator.state.broker import with_db
from coordinator.state.budget import MemoryBudget
from coordinator.state.hedgedelay import MemoryDelayWindow
from coordinator.state.lean import LeanScript
from coordinator.state.memstore import MemoryStore
from coordinator.state.opening import GroupOpening
from coordinator.state.store import RedisStore
from schemas.enums import GroupSignal
from schemas.models import BackendSpec, Candidate, MemberTask, Message
from workers.member import MemberContext, execute_member

TTL = 60.0
INF = ProfileSettings()
OBS = CandidateObservation(1.0, True, None, 0.8, 0.25, 10, 20)
IDS, LINKS = ["c1", "c2"], ["a->b"]
T0 = time.time()


def _reader(redis_db: redis.Redis, now: list[float]) -> RedisStore:
    store = RedisStore(redis_db)
    store.view_clock = lambda: now[0]
    return store


def test_a_view_read_within_fresh_s_is_planned_on_without_a_read(redis_db: redis.Redis) -> None:
    now = [100.0]
    reader = _reader(redis_db, now)
    writer = RedisStore(redis.Redis(connection_pool=redis_db.connection_pool))
    writer.update_candidate("c1", OBS, INF, TTL)
    first = reader.read_for_plan(IDS, LINKS, "g1", TTL, None, fresh_s=1.0)
    assert first.opened and reader.group_state("g1") is GroupSignal.OPEN
    assert first.candidates["c1"].calls == 1 and first.cooling == set()

    writer.update_candidate("c1", OBS, INF, TTL)  # written after the read ...
    writer.set_cooldown("c2", TTL, 1e12)
    now[0] += 0.9
    again = reader.read_for_plan(IDS, LINKS, "g2", TTL, None, fresh_s=1.0)
    # ... and not seen: the cached view, nothing opened (the sender opens the group).
    assert not again.opened and reader.group_state("g2") is None
    assert again.candidates == first.candidates and again.cooling == set()
    assert again.links == first.links

    now[0] += 0.2  # the view is older than fresh_s: read again
    third = reader.read_for_plan(IDS, LINKS, "g3", TTL, None, fresh_s=1.0)
    assert third.opened and reader.group_state("g3") is GroupSignal.OPEN
    assert third.candidates["c1"].calls == 2 and third.cooling == {"c2"}


def test_fresh_s_zero_or_an_unread_candidate_makes_it_a_read(redis_db: redis.Redis) -> None:
    now = [100.0]
    reader = _reader(redis_db, now)
    reader.read_for_plan(["c1"], LINKS, None, TTL, None, fresh_s=10.0)
    reader.update_candidate("c1", OBS, INF, TTL)
    assert "c1" in reader.read_for_plan(["c1"], LINKS, "g1", TTL, None, fresh_s=0.0).candidates
    reader.update_candidate("c2", OBS, INF, TTL)
    # c2 was never read by this process: the whole view is read, and the group opened.
    got = reader.read_for_plan(IDS, LINKS, "g2", TTL, None, fresh_s=10.0)
    assert got.opened and "c2" in got.candidates


def test_the_memory_store_always_reads() -> None:
    store = MemoryStore()
    store.read_for_plan(IDS, LINKS, None, TTL, None, fresh_s=10.0)
    store.update_candidate("c1", OBS, INF, TTL)
    got = store.read_for_plan(IDS, LINKS, "g1", TTL, None, fresh_s=10.0)
    assert got.opened and "c1" in got.candidates
    assert store.group_state("g1") is GroupSignal.OPEN


def test_a_view_is_built_again_only_when_what_it_is_built_from_changed(
    redis_db: redis.Redis,
) -> None:
    # Unchanged profiles hand back the same objects (the plan cache's), so the view's
    # arrays are reused, sized for each request; a changed profile or a cooldown builds
    # them again. Either way the view is build_view's own, to the bit.
    settings = HacoSettings(plan_view_fresh_s=0.0)  # every view() is a read
    store = RedisStore(redis_db)
    store.update_candidate("c0", OBS, INF, TTL)
    pool = small_pool(3)
    views = Views(pool, store, settings, INF)

    def rebuilt(nbytes: float) -> PoolView:
        members = [
            PoolMember(c.id, c.zone, c.model, "") for c in views.view(ROLE, 0, None, None)[0]
        ]
        read = store.read_for_plan([m.candidate_id for m in members], ["local->local"], None, TTL)
        return build_view(members, "local", read.candidates, read.links, nbytes, INF)

    def equal(x: object, y: object) -> bool:
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            return np.array_equal(x, y)  # type: ignore[arg-type]
        return x == y

    def same(a: PoolView, b: PoolView) -> bool:
        # Every field of the view and of its statistics, a field added later included.
        return all(
            equal(getattr(a, f.name), getattr(b, f.name))
            for f in dataclasses.fields(PoolView) if f.name != "stats"
        ) and all(
            equal(getattr(a.stats, f.name), getattr(b.stats, f.name))
            for f in dataclasses.fields(CandidateArrays) if f.compare  # not the memo
        )  # fmt: skip

    _, first, _ = views.view(ROLE, 100.0, None, None)
    _, bigger, _ = views.view(ROLE, 5123.5, None, None)
    assert bigger.stats.alpha is first.stats.alpha  # read again, nothing changed: reused
    assert same(first, rebuilt(100.0)) and same(bigger, rebuilt(5123.5))
    store.update_candidate("c0", OBS, INF, TTL)
    _, changed, _ = views.view(ROLE, 5123.5, None, None)
    assert changed.stats.alpha is not first.stats.alpha
    assert changed.calls[0] == first.calls[0] + 1 and same(changed, rebuilt(5123.5))
    store.set_cooldown("c1", TTL, 1e12)
    cands, cooled, _ = views.view(ROLE, 5123.5, None, None)
    assert [c.id for c in cands] == ["c0", "c2"] and list(cooled.ids) == ["c0", "c2"]


# ---------------------------------------------------------------- the send opens the group


def _member(rank: int, zone: str) -> MemberTask:
    cand = Candidate(
        id=f"c{rank}", role="coder", model="m", zone=zone, backend=BackendSpec(kind="http")
    )
    return MemberTask(
        group_id="g1", member_id=f"g1.{rank}", rank=rank, candidate=cand, caller_zone="local",
        payload=[Message(role="user", content="hi")], deadline_at_s=T0 + 30.0,
        enqueued_at_s=T0,
    )  # fmt: skip


@pytest.fixture
def server(runtime_redis_url: str) -> Iterator[str]:
    flush_runtime_dbs(runtime_redis_url)
    yield runtime_redis_url
    flush_runtime_dbs(runtime_redis_url)


def _entries(r: redis.Redis, queue: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in reversed(r.lrange(queue, 0, -1))]


def test_the_opening_rides_in_the_members_round_trip(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    zones = frozenset({"local", "remote"})
    app = sending_app(HacoSettings(), server)
    fused = CeleryDispatcher(app, zones, app_db=keys.APP_DB)
    plain = CeleryDispatcher(app, zones)
    app_r = redis.Redis.from_url(with_db(server, keys.APP_DB))
    broker_r = redis.Redis.from_url(with_db(server, keys.BROKER_DB))
    calls: list[str] = []
    execute = redis.client.Pipeline.execute
    monkeypatch.setattr(
        redis.client.Pipeline,
        "execute",
        lambda self, raise_on_error=True: calls.append("pipeline") or execute(self, raise_on_error),
    )
    evalsha = LeanScript.__call__
    monkeypatch.setattr(
        LeanScript,
        "__call__",
        lambda self, *a, **k: calls.append("script") or evalsha(self, *a, **k),
    )
    opened: list[str] = []
    try:
        opening = GroupOpening("g1", TTL, (0.05, 60_000), lambda: opened.append("g1"))
        fused.send_many([("local", _member(0, "local")), ("remote", _member(1, "remote"))], opening)
        assert calls == ["script"] and opened == []  # one round trip; not the fallback
        assert app_r.get(keys.group_state("g1")) == GroupSignal.OPEN.value.encode()
        assert 0 < app_r.pttl(keys.group_state("g1")) <= TTL * 1000
        assert float(app_r.hget(keys.BUDGET, "pend") or 0) == pytest.approx(0.05)
        ours = _entries(broker_r, keys.queue_for("local")) + _entries(broker_r, "haco.zone.remote")
        assert [e["headers"]["task"] for e in ours] == [keys.MEMBER_TASK] * 2
        # The queues and bindings landed in the broker's database only, and the client's
        # connection is still on it.
        assert not app_r.exists(keys.queue_for("local"))
        assert fused.redis is not None and fused.redis.llen(keys.queue_for("local")) == 1

        # The same messages as the pipeline writes (bindings declared once per dispatcher).
        broker_r.delete(keys.queue_for("local"))
        plain.send_many([("local", _member(0, "local"))])
        (theirs,) = _entries(broker_r, keys.queue_for("local"))
        assert list(theirs) == list(ours[0]) and theirs["body"] == ours[0]["body"]
        assert set(broker_r.keys()) >= {b"_kombu.binding.haco.zone.local"}

        # Without app_db, the opening's own round trip goes first.
        calls.clear()

        def open_first() -> None:
            assert broker_r.llen(keys.queue_for("remote")) == 1  # nothing new queued yet
            opened.append("g2")

        plain.send_many(
            [("remote", _member(2, "remote"))], GroupOpening("g2", TTL, None, open_first)
        )
        assert opened == ["g2"] and broker_r.llen(keys.queue_for("remote")) == 2
    finally:
        for c in (fused, plain):
            c.close()
        app_r.close()
        broker_r.close()


# ---------------------------------------------------------------- the coordinator


def test_the_coordinator_reads_after_a_failure_it_saw(redis_db: redis.Redis) -> None:
    settings = HacoSettings(default_deadline_s=3.0, plan_view_fresh_s=60.0)
    store = RedisStore(redis_db)
    reads: list[int] = []
    script = store._plan_script
    store._plan_script = lambda *a, **k: reads.append(1) or script(*a, **k)  # type: ignore[method-assign]
    backend = ScriptedBackend({"c0": Step(0.0)})
    ctx = MemberContext(store=store, backends=lambda _t: backend, settings=settings)
    pool = small_pool(1)
    dispatcher = ThreadDispatcher(lambda t: execute_member(t, ctx), pool.zones)
    coord = Coordinator(
        pool, store, dispatcher, MemoryBudget(settings), MemoryDelayWindow(settings), settings,
    )  # fmt: skip
    try:
        coord.invoke(invocation())
        assert len(reads) == 1
        coord.invoke(invocation())  # the fresh view; the group opened by GroupOpening.open
        assert len(reads) == 2  # that open is the read script with no ids, nothing else
        backend.script["c0"] = Step(0.0, ok=False)
        with pytest.raises(AllFailedError):
            coord.invoke(invocation())
        assert len(reads) == 3  # planned on the fresh view, its group opened: one each
        backend.script["c0"] = Step(0.0)
        coord.invoke(invocation())
        assert len(reads) == 4  # the failure made this plan read the role afresh
        coord.invoke(invocation())
        assert len(reads) == 5
    finally:
        coord.close()
        dispatcher.close()
