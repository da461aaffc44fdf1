"""Real model endpoints through the distributed path: a Celery worker process (`haco
worker`, as `haco up` starts it) whose pool config points at the fake OpenAI server
(tests/fake_openai.py) of this test process, invoked through ``HacoClient``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from fake_openai import ANSWER, FakeServer
from polling import wait_for
from services import flush_runtime_dbs, wait_ready

from coordinator.config import HacoSettings
from coordinator.runtime.client import HacoClient
from coordinator.services.supervisor import Stack, start_stack
from coordinator.state import keys
from schemas.enums import FailureKind, MemberStatus
from schemas.models import MemberReport

KEY = "sk-test-SECRET-1234"
ZONE = "local"


@dataclass
class Deployed:
    server: FakeServer
    stack: Stack
    client: HacoClient
    logs: Path

    @property
    def r(self) -> redis.Redis:
        return self.client.redis


def pool_file(folder: Path, server: FakeServer) -> Path:
    cands = ""
    for model, stream in [("ok", "true"), ("rate-limit", "false"), ("echo-auth", "false")]:
        cands += f"""
[[candidates]]
id = "c-{model}"
role = "coder"
model = "{model}"
zone = "{ZONE}"
[candidates.backend]
kind = "openai"
[candidates.backend.settings]
base_url = "{server.url}/v1"
api_key_env = "HACO_TEST_KEY"
stream = {stream}
read_timeout_s = 10.0
"""
    path = folder / "pool.toml"
    path.write_text(f'caller_zone = "{ZONE}"\nzones = ["{ZONE}"]\n{cands}', encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def deployed(
    runtime_redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployed]:
    server = FakeServer().start()
    tmp = tmp_path_factory.mktemp("endpoints")
    pool = pool_file(tmp, server)
    with pytest.MonkeyPatch.context() as mp:
        for name in [n for n in os.environ if n.startswith("HACO_")]:
            mp.delenv(name)
        mp.setenv("HACO_POOL_FILE", str(pool))  # the worker reads both from its environment
        mp.setenv("HACO_TEST_KEY", KEY)
        flush_runtime_dbs(runtime_redis_url)
        base = HacoSettings(redis_url=runtime_redis_url, state_dir=tmp / "state")
        stack = start_stack(base, [ZONE], concurrency=8)
        try:
            settings = HacoSettings(redis_url=stack.redis_url, pool_file=pool)
            with HacoClient(settings, redis_url=stack.redis_url) as client:
                wait_ready(client, [ZONE], 30.0)
                yield Deployed(server, stack, client, tmp / "state" / "logs")
        finally:
            stack.stop()
            server.stop()
            flush_runtime_dbs(runtime_redis_url)


def test_a_worker_calls_the_endpoint_and_a_429_cools_its_candidate_down(
    deployed: Deployed,
) -> None:
    res = deployed.client.invoke("coder", "say hello", deadline_s=20)
    assert (res.candidate_id, res.output) == ("c-ok", ANSWER)
    assert {m.candidate_id for m in res.members} == {"c-ok", "c-rate-limit", "c-echo-auth"}
    # The worker sent the key, as a Bearer token, and nothing else carries it.
    (echoed,) = deployed.server.of("echo-auth")
    assert echoed.headers["authorization"] == f"Bearer {KEY}"
    assert deployed.r.pttl(keys.cooldown("c-rate-limit")) > 0  # Retry-After: 7 s

    def traced() -> list[MemberReport]:
        field = keys.REPORT_FIELD.encode()
        entries = deployed.r.xrange(keys.TRACES)
        reps = [MemberReport.model_validate_json(f[field]) for _, f in entries if field in f]
        mine = [x for x in reps if x.trace.group_id == res.group_id]
        return mine if len(mine) == 3 else []

    reports = wait_for("the three traces", traced)
    by = {x.trace.candidate_id: x.trace for x in reports}
    assert by["c-rate-limit"].failure_kind is FailureKind.RATE_LIMITED
    assert by["c-echo-auth"].failure_kind is FailureKind.SERVER_ERROR
    assert "Bearer ***" in (by["c-echo-auth"].failure_reason or "")
    ok = by["c-ok"]
    assert ok.status is MemberStatus.SUCCEEDED and (ok.tokens_in, ok.tokens_out) == (11, 9)

    again = deployed.client.invoke("coder", "say hello", deadline_s=20)
    assert "c-rate-limit" not in {m.candidate_id for m in again.members}  # cooling down
    assert len(deployed.server.of("rate-limit")) == 1

    # The key is nowhere: not in any Redis key or value, nor in the worker's logs.
    for name in deployed.r.scan_iter(count=1000):
        assert KEY.encode() not in name
        if deployed.r.type(name) == b"stream":
            assert KEY.encode() not in repr(deployed.r.xrange(name)).encode()
        elif deployed.r.type(name) == b"string":
            assert KEY.encode() not in (deployed.r.get(name) or b"")
        elif deployed.r.type(name) == b"hash":
            assert KEY.encode() not in repr(deployed.r.hgetall(name)).encode()
        elif deployed.r.type(name) == b"list":
            assert KEY.encode() not in repr(deployed.r.lrange(name, 0, -1)).encode()
    logs = [p.read_text(errors="replace") for p in deployed.logs.glob("*") if p.is_file()]
    assert logs and not any(KEY in text or "SECRET" in text for text in logs)
