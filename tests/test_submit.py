"""Enqueue now, collect later (coordinator.runtime.handles): a submitted invocation runs in
the background and any process collects its outcome, the same result or the same error
``invoke`` gives. The invocations run on the in-process runtime (tests/runtime_helpers.py);
their outcomes go to the in-memory store or to Redis, where another process reads them."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator

import pytest
import redis
from polling import wait_for
from runtime_helpers import ROLE, Runtime, ScriptedBackend, Step, build_runtime

from coordinator.config import HacoSettings
from coordinator.errors import (
    AllFailedError,
    InputError,
    ResultPendingError,
    UnknownInvocationError,
    UnknownRoleError,
)
from coordinator.runtime.aio import Hubs
from coordinator.runtime.client import HacoClient
from coordinator.runtime.handles import InvocationHandle, Run, Submitter
from coordinator.runtime.outcome import InvocationState
from coordinator.runtime.ports import OutcomeStore
from coordinator.runtime.results import InvocationResult
from coordinator.state import keys
from coordinator.state.broker import with_db
from coordinator.state.memstore import MemoryStore
from coordinator.state.store import RedisStore
from schemas.models import Message, RoleInvocation

SETTINGS = HacoSettings(result_recheck_s=0.2)
OK = {"c0": Step(0.01), "c1": Step(0.01), "c2": Step(0.01)}
FAILING = {c: Step(0.01, ok=False) for c in ("c0", "c1", "c2")}


def inv(**overrides: object) -> RoleInvocation:
    return RoleInvocation(
        role=ROLE,
        payload=[Message(role="user", content="sort a list")],
        **overrides,
    )


@pytest.fixture
def runtime_ok() -> Iterator[Runtime]:
    rt = build_runtime(ScriptedBackend(OK))
    yield rt
    rt.dispatcher.close()


@pytest.fixture
def runtime_failing() -> Iterator[Runtime]:
    rt = build_runtime(ScriptedBackend(FAILING))
    yield rt
    rt.dispatcher.close()


def submitter(store: OutcomeStore, rt: Runtime) -> Submitter:
    return Submitter(store, rt.coordinator.invoke, SETTINGS)


def test_submit_then_collect_in_the_same_process(runtime_ok: Runtime) -> None:
    store = MemoryStore()
    sub = submitter(store, runtime_ok)
    handle = sub.submit(inv())
    result = handle.result(timeout_s=30.0)
    sub.close()
    assert result.group_id == handle.id  # the id assigned at submit is the group's
    assert result.candidate_id == "c0" and result.output == "output of c0"
    status = InvocationHandle(handle.id, store, SETTINGS).status()
    assert status.state is InvocationState.DONE
    assert status.result == result and status.error is None


def test_an_all_failed_invocation_raises_with_every_reason(runtime_failing: Runtime) -> None:
    store = MemoryStore()
    sub = submitter(store, runtime_failing)
    handle = sub.submit(inv())
    with pytest.raises(AllFailedError) as caught:
        handle.result(timeout_s=30.0)
    sub.close()
    assert caught.value.group_id == handle.id
    assert set(caught.value.failures) == {f"{handle.id}.{r}" for r in range(3)}
    assert all("scripted failure" in why for why in caught.value.failures.values())
    # the same error invoke raises: class, message, reasons
    with pytest.raises(AllFailedError) as direct:
        runtime_failing.coordinator.invoke(inv())
    assert len(direct.value.failures) == len(caught.value.failures)
    status = handle.status()
    assert status.state is InvocationState.DONE and status.result is None
    assert status.error is not None and status.error.kind == "AllFailedError"
    assert status.error.failures == caught.value.failures
    assert status.error.message == str(caught.value)


def test_pending_running_and_timeout() -> None:
    store = MemoryStore()
    gate = threading.Event()
    entered = threading.Event()

    def run(_inv: RoleInvocation, gid: str) -> InvocationResult:
        entered.set()
        gate.wait(30.0)
        raise UnknownRoleError(f"scripted: no role for {gid}")

    sub = Submitter(store, run, HacoSettings(submit_workers=1, result_recheck_s=0.05))
    first, second = sub.submit(inv()), sub.submit(inv())
    assert first.id != second.id
    wait_for("the first to run", entered.is_set)
    assert first.status().state is InvocationState.RUNNING
    assert second.status().state is InvocationState.PENDING  # the one worker is busy
    with pytest.raises(ResultPendingError, match=first.id):
        first.result(timeout_s=0.1)
    gate.set()
    with pytest.raises(UnknownRoleError, match="scripted: no role"):
        second.result(timeout_s=30.0)  # an input error found while planning: same class
    sub.close()
    with pytest.raises(InputError, match="closed"):
        sub.submit(inv())


def test_unknown_and_invalid_ids() -> None:
    store = MemoryStore()
    handle = InvocationHandle("never-submitted", store, SETTINGS)
    assert handle.status().state is InvocationState.UNKNOWN
    with pytest.raises(UnknownInvocationError, match="never-submitted"):
        handle.result(timeout_s=5.0)
    for bad in ["", "a b", "x" * 129, "../etc"]:
        with pytest.raises(InputError, match="invocation id"):
            InvocationHandle(bad, store, SETTINGS)
    with pytest.raises(InputError, match="timeout_s"):
        handle.result(timeout_s=-1.0)


def test_result_expires_with_its_ttl(runtime_ok: Runtime) -> None:
    class Clock:
        now = 0.0

        def __call__(self) -> float:
            return self.now

    clock = Clock()
    store = MemoryStore(clock=clock)
    settings = HacoSettings(result_ttl_s=100.0, result_recheck_s=0.05)
    sub = Submitter(store, runtime_ok.coordinator.invoke, settings)
    handle = sub.submit(inv(deadline_s=3.0))
    handle.result(timeout_s=30.0)
    sub.close()
    clock.now = 99.0
    assert handle.status().state is InvocationState.DONE
    clock.now = 101.0  # the outcome expired; the accepted record (deadline + ttl) not yet
    assert handle.status().state is InvocationState.RUNNING
    clock.now = 104.0
    assert handle.status().state is InvocationState.UNKNOWN
    with pytest.raises(UnknownInvocationError):
        handle.result(timeout_s=1.0)


COLLECT = """
import json, sys
from coordinator.config import HacoSettings
from coordinator.errors import HedgeError
from coordinator.runtime.client import HacoClient
url, gid = sys.argv[1:3]
with HacoClient(HacoSettings(result_recheck_s=0.2), redis_url=url) as client:
    handle = client.handle(gid)
    try:
        res = handle.result(timeout_s=60.0)
        print(json.dumps({"ok": handle.status().model_dump(mode="json")}))
    except HedgeError as exc:
        print(json.dumps({"error": type(exc).__name__, "group": exc.group_id,
                          "failures": getattr(exc, "failures", None), "message": str(exc)}))
"""


def collect_elsewhere(url: str, gid: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-c", COLLECT, url, gid]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def collected(proc: subprocess.Popen[str]) -> dict[str, object]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    got: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return got


def blocked_on_done(r: redis.Redis) -> bool:
    """Whether some client waits on a done token (the collector, in BLMOVE)."""
    return any(c.get("cmd") == "blmove" for c in r.client_list())


@pytest.fixture
def app_redis(runtime_redis_url: str) -> Iterator[redis.Redis]:
    """The application database HacoClient uses on this run's own server."""
    client = redis.Redis.from_url(with_db(runtime_redis_url, keys.APP_DB))
    yield client
    client.close()


def test_collect_from_another_process(
    runtime_ok: Runtime, runtime_failing: Runtime, app_redis: redis.Redis, runtime_redis_url: str
) -> None:
    store = RedisStore(app_redis)
    ids = [f"sub-{uuid.uuid4().hex[:12]}" for _ in range(2)]
    gate = threading.Event()

    def gated(run: Run) -> Run:
        def go(inv: RoleInvocation, gid: str) -> InvocationResult:
            gate.wait(60.0)
            return run(inv, gid)

        return go

    ok = Submitter(store, gated(runtime_ok.coordinator.invoke), SETTINGS, new_id=lambda: ids[0])
    failing = Submitter(
        store, gated(runtime_failing.coordinator.invoke), SETTINGS, new_id=lambda: ids[1]
    )
    h_ok, h_bad = ok.submit(inv()), failing.submit(inv())
    # the collector starts before the outcome exists, and waits on the done token
    proc = collect_elsewhere(runtime_redis_url, h_ok.id)
    wait_for("the other process to wait", lambda: blocked_on_done(app_redis))
    gate.set()
    got = collected(proc)
    mine = h_ok.result(timeout_s=30.0)
    status = h_ok.status().model_dump(mode="json")
    assert got == {"ok": status}
    assert status["result"]["output"] == mine.output == "output of c0"
    got = collected(collect_elsewhere(runtime_redis_url, h_bad.id))
    with pytest.raises(AllFailedError) as caught:
        h_bad.result(timeout_s=30.0)
    assert got == {
        "error": "AllFailedError",
        "group": h_bad.id,
        "failures": caught.value.failures,
        "message": str(caught.value),
    }
    ok.close()
    failing.close()
    for gid in ids:
        app_redis.delete(
            keys.invocation_accepted(gid), keys.invocation_result(gid), keys.invocation_done(gid)
        )


def test_client_submit_rejects_a_bad_call_at_once(runtime_redis_url: str) -> None:
    with HacoClient(HacoSettings(), redis_url=runtime_redis_url) as client:
        with pytest.raises(UnknownRoleError, match="no-such-role"):
            client.submit("no-such-role", "hi")
        with pytest.raises(InputError, match="tau"):
            client.submit(ROLE, "hi", tau=7.0)
        assert client.handle("nothing-here").status().state is InvocationState.UNKNOWN


def test_aresult_waits_on_the_reply_hub(
    runtime_ok: Runtime, redis_db: redis.Redis, redis_url: str
) -> None:
    store = RedisStore(redis_db)
    settings = HacoSettings(result_recheck_s=5.0, hub_shards=2, hub_idle_s=0.2)
    hubs = Hubs(redis_url, settings)
    gate = threading.Event()

    def gated(inv: RoleInvocation, gid: str) -> InvocationResult:
        gate.wait(60.0)
        return runtime_ok.coordinator.invoke(inv, gid)

    sub = Submitter(store, gated, settings, hubs=hubs)
    handle = sub.submit(inv())
    elsewhere: list[InvocationResult] = []  # a blocking waiter (BLMOVE) beside the hub
    blocking = threading.Thread(target=lambda: elsewhere.append(handle.result(60.0)))
    blocking.start()

    async def collect() -> list[InvocationResult]:
        hub = hubs.current()
        waiters = [asyncio.ensure_future(handle.aresult(60.0)) for _ in range(2)]
        while hub.waiting == 0:  # both wait on the done list, through the hub
            await asyncio.sleep(0.01)
        gate.set()
        try:
            return list(await asyncio.gather(*waiters))
        finally:
            await hubs.aclose()

    got = asyncio.run(collect())
    blocking.join(60.0)
    sub.close()
    assert got[0] == got[1] == elsewhere[0]
    assert got[0].group_id == handle.id and got[0].output == "output of c0"


def test_aresult_unknown_and_pending(redis_db: redis.Redis, redis_url: str) -> None:
    store = RedisStore(redis_db)
    settings = HacoSettings(result_recheck_s=0.05, hub_shards=1, hub_idle_s=0.2)
    hubs = Hubs(redis_url, settings)
    store.set_invocation_phase("still-running", "running", 60.0)

    async def check() -> None:
        try:
            with pytest.raises(UnknownInvocationError):
                await InvocationHandle("nope", store, settings, hubs).aresult(1.0)
            with pytest.raises(ResultPendingError, match="still running"):
                await InvocationHandle("still-running", store, settings, hubs).aresult(0.1)
        finally:
            await hubs.aclose()

    asyncio.run(check())
