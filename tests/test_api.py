"""The coordinator service (`haco serve`, coordinator/api/) end to end: a real uvicorn
server in a thread of this process, its HacoClient in front of a real worker process
(`haco worker`, as `haco up` starts it) whose candidates are the fake OpenAI server of
tests/fake_openai.py; called with the official openai SDK (sync, async, streamed) and
with httpx for the error cases. The fuzzing goes through the ASGI app directly."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import openai
import pytest
from fake_openai import ANSWER, FakeServer
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polling import wait_for
from services import flush_runtime_dbs, wait_ready
from web import UvicornThread

from coordinator.api.app import create_app
from coordinator.api.health import Readiness
from coordinator.config import HacoSettings
from coordinator.runtime.client import HacoClient
from coordinator.services.supervisor import start_stack

TOKEN = "tok-test-1"
ZONE = "local"
# role -> [(candidate id, fake model behaviour, read timeout)]
ROLES = {
    "coder": [("c-ok", "ok", 10.0), ("c-ok2", "no-usage", 10.0)],
    "broken": [("b-500", "500", 10.0), ("b-503", "503", 10.0)],
    "slow": [("s-hang", "hang", 3.0)],
    # tests/test_streaming.py: one streams at once, the other never sends a byte
    "race": [("r-ok", "ok:race", 10.0), ("r-hang", "hang:race", 10.0)],
    "cut": [("x-stall", "stall:cut", 1.0)],  # three words, then silence: a read timeout
}


@dataclass
class Served:
    url: str
    client: HacoClient
    settings: HacoSettings
    fake: FakeServer


def pool_file(folder: Path, server: FakeServer, zones: list[str] = [ZONE]) -> Path:  # noqa: B006
    cands = ""
    for role, members in ROLES.items():
        for cid, model, read_s in members:
            cands += f"""
[[candidates]]
id = "{cid}"
role = "{role}"
model = "{model}"
zone = "{zones[-1] if role == "slow" else ZONE}"
[candidates.backend]
kind = "openai"
[candidates.backend.settings]
base_url = "{server.url}/v1"
api_key_env = "HACO_TEST_KEY"
read_timeout_s = {read_s}
"""
    path = folder / f"pool-{len(zones)}.toml"
    path.write_text(f'caller_zone = "{ZONE}"\nzones = {zones!r}\n{cands}', encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def served(runtime_redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    fake = FakeServer().start()
    tmp = tmp_path_factory.mktemp("api")
    pool = pool_file(tmp, fake)
    with pytest.MonkeyPatch.context() as mp:
        for name in [n for n in os.environ if n.startswith("HACO_")]:
            mp.delenv(name)
        mp.setenv("HACO_POOL_FILE", str(pool))  # the worker reads both from its environment
        mp.setenv("HACO_TEST_KEY", "sk-test")
        flush_runtime_dbs(runtime_redis_url)
        stack = start_stack(HacoSettings(redis_url=runtime_redis_url, state_dir=tmp / "s"), [ZONE])
        try:
            settings = HacoSettings(
                redis_url=stack.redis_url, pool_file=pool, api_tokens=f"other, {TOKEN}"
            )
            with HacoClient(settings, redis_url=stack.redis_url) as client:
                wait_ready(client, [ZONE], 30.0)
                with UvicornThread(create_app(settings, client)) as server:
                    yield Served(server.url, client, settings, fake)
        finally:
            stack.stop()
            fake.stop()
            flush_runtime_dbs(runtime_redis_url)


def auth() -> dict[str, str]:
    return {"authorization": f"Bearer {TOKEN}"}


def test_the_openai_sdk_gets_a_hedged_completion(served: Served) -> None:
    sdk = openai.OpenAI(base_url=f"{served.url}/v1", api_key=TOKEN, max_retries=0)
    raw = sdk.chat.completions.with_raw_response.create(
        model="coder",
        messages=[{"role": "user", "content": "say hello"}],
        extra_body={"haco": {"tau": 0.9, "deadline_s": 20}},
    )
    done = raw.parse()
    assert done.object == "chat.completion" and done.model == "coder"
    assert done.choices[0].message.content == ANSWER
    assert done.choices[0].finish_reason == "stop"
    assert raw.headers["x-haco-candidate"] in {"c-ok", "c-ok2"}
    assert raw.headers["x-haco-zone"] == ZONE
    assert set(raw.headers["x-haco-members"].split(",")) <= {"c-ok", "c-ok2"}
    assert done.id == f"chatcmpl-{raw.headers['x-haco-invocation-id']}"
    if raw.headers["x-haco-candidate"] == "c-ok":  # the fake's usage, from the winner
        assert done.usage is not None
        assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (11, 9)
    assert [m.id for m in sdk.models.list().data] == sorted(ROLES)


def test_the_async_sdk_and_a_stream(served: Served) -> None:
    async def calls() -> tuple[str, list[str]]:
        sdk = openai.AsyncOpenAI(base_url=f"{served.url}/v1", api_key=TOKEN, max_retries=0)
        try:
            done = await sdk.chat.completions.create(
                model="coder", messages=[{"role": "user", "content": "hi"}]
            )
            stream = await sdk.chat.completions.create(
                model="coder", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
            return done.choices[0].message.content or "", parts
        finally:
            await sdk.close()

    text, parts = asyncio.run(calls())
    assert text == ANSWER
    assert "".join(parts) == ANSWER and len(parts) > 2


def test_the_native_form_has_every_member(served: Served) -> None:
    body = {"role": "coder", "messages": [{"role": "user", "content": "x"}], "deadline_s": 20}
    res = httpx.post(f"{served.url}/v1/invocations", json=body, headers=auth(), timeout=30)
    assert res.status_code == 200, res.text
    out = res.json()
    assert out["id"] == res.headers["x-haco-invocation-id"] and out["output"] == ANSWER
    assert {m["candidate"] for m in out["members"]} == {"c-ok", "c-ok2"}
    assert {"zone", "rank", "status", "latency_s", "reason", "tokens_in"} <= set(out["members"][0])


def test_an_invocation_submitted_without_waiting_is_collected_by_id(served: Served) -> None:
    def submit(role: str) -> str:
        body = {"role": role, "messages": [{"role": "user", "content": "x"}], "wait": False}
        res = httpx.post(f"{served.url}/v1/invocations", json=body, headers=auth(), timeout=30)
        assert res.status_code == 202, res.text
        assert res.json()["status"] == "pending"
        assert res.headers["location"] == f"/v1/invocations/{res.json()['id']}"
        return str(res.json()["id"])

    def collect(invocation_id: str) -> dict[str, Any]:
        url = f"{served.url}/v1/invocations/{invocation_id}"

        def done() -> dict[str, Any] | None:
            res = httpx.get(url, headers=auth(), timeout=30)
            assert res.status_code == 200, res.text
            out: dict[str, Any] = res.json()
            return None if out["status"] in ("pending", "running") else out

        return wait_for("the submitted invocation to finish", done, 30.0)

    ok, broken = submit("coder"), submit("broken")
    out = collect(ok)
    assert (out["id"], out["status"], out["output"]) == (ok, "succeeded", ANSWER)
    failed = collect(broken)
    assert failed["status"] == "failed" and failed["error"]["code"] == "all_failed"
    assert len(failed["error"]["failures"]) == 2
    res = httpx.get(f"{served.url}/v1/invocations/never-submitted", headers=auth())
    assert res.status_code == 404 and res.json()["error"]["code"] == "invocation_not_found"


def test_upstream_failures_are_502_and_504_with_the_reasons(served: Served) -> None:
    body: dict[str, Any] = {"model": "broken", "messages": [{"role": "user", "content": "x"}]}
    res = httpx.post(f"{served.url}/v1/chat/completions", json=body, headers=auth(), timeout=30)
    assert res.status_code == 502, res.text
    error = res.json()["error"]
    assert error["code"] == "all_failed" and len(error["failures"]) == 2
    assert res.headers["x-haco-invocation-id"] in error["message"]
    body = {"model": "slow", "messages": body["messages"], "haco": {"deadline_s": 0.5}}
    res = httpx.post(f"{served.url}/v1/chat/completions", json=body, headers=auth(), timeout=30)
    assert res.status_code == 504, res.text
    assert res.json()["error"]["code"] == "deadline_exceeded"


def test_metrics_count_the_invocations(served: Served) -> None:
    """After the tests above: won coder calls and an all-failed broken one were served."""
    lines = httpx.get(f"{served.url}/metrics", timeout=30).text.splitlines()
    values = {k: float(v) for k, _, v in (ln.rpartition(" ") for ln in lines) if k[:1] != "#"}
    assert values['haco_invocations_total{role="coder",state="won"}'] >= 3
    assert values['haco_all_failed_total{role="broken"}'] >= 1


def test_client_mistakes_are_openai_style_4xx(served: Served) -> None:
    url = f"{served.url}/v1/chat/completions"
    msgs = [{"role": "user", "content": "x"}]
    cases: list[tuple[int, dict[str, Any]]] = [
        (404, {"json": {"model": "nobody", "messages": msgs}}),
        (400, {"json": {"model": "coder", "messages": msgs, "haco": {"tau": 1.5}}}),
        (400, {"json": {"model": "coder", "messages": [{"role": "user"}]}}),
        (400, {"json": {"model": "coder", "messages": "hi"}}),
        (400, {"json": {"model": 3, "messages": msgs}}),
        (400, {"content": b"{not json", "headers": {"content-type": "application/json"}}),
        (413, {"content": b" " * (2 << 20), "headers": {"content-type": "application/json"}}),
    ]
    for status, kwargs in cases:
        headers = {**auth(), **kwargs.pop("headers", {})}
        res = httpx.post(url, headers=headers, timeout=30, **kwargs)
        assert res.status_code == status, (kwargs, res.text)
        error = res.json()["error"]
        assert set(error) >= {"message", "type", "param", "code"} and error["message"]
    chunked = httpx.post(url, headers=auth(), content=iter([b" " * (1 << 19)] * 4), timeout=30)
    assert chunked.status_code == 413, chunked.text  # no Content-Length: counted as it comes
    assert httpx.post(url, json={"model": "coder", "messages": msgs}).status_code == 401
    wrong = {"authorization": "Bearer nope"}
    res = httpx.get(f"{served.url}/v1/models", headers=wrong)
    assert res.status_code == 401 and res.json()["error"]["type"] == "authentication_error"
    res = httpx.get(f"{served.url}/v1/nothing-here", headers=auth())
    assert res.status_code == 404 and "error" in res.json()
    sdk = openai.OpenAI(base_url=f"{served.url}/v1", api_key=TOKEN, max_retries=0)
    with pytest.raises(openai.NotFoundError, match="unknown role 'nobody'"):
        sdk.chat.completions.create(model="nobody", messages=[{"role": "user", "content": "x"}])


def test_health_readiness_and_profiles(served: Served) -> None:
    assert httpx.get(f"{served.url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{served.url}/readyz", timeout=30)
    assert ready.status_code == 200, ready.text
    profiles = httpx.get(f"{served.url}/v1/profiles?role=coder", headers=auth(), timeout=30)
    assert profiles.status_code == 200, profiles.text
    assert {row["candidate"] for row in profiles.json()["data"]} == {"c-ok", "c-ok2"}
    none = httpx.get(f"{served.url}/v1/profiles?role=nobody", headers=auth(), timeout=30)
    assert none.status_code == 404


def test_a_zone_without_a_worker_is_not_ready(served: Served, tmp_path: Path) -> None:
    pool = pool_file(tmp_path, served.fake, zones=[ZONE, "dark"])
    settings = served.settings.model_copy(update={"pool_file": pool})
    with HacoClient(settings, redis_url=served.settings.redis_url) as client:
        now = [0.0]
        readiness = Readiness(client, settings, clock=lambda: now[0])
        checks = []
        real = readiness._check

        def counted() -> list[str]:
            checks.append(1)
            return real()

        readiness._check = counted  # type: ignore[method-assign]
        problems = readiness.problems()
        assert len(problems) == 1 and "'dark'" in problems[0]
        assert readiness.problems() == problems and len(checks) == 1  # cached
        now[0] += settings.api_ready_cache_s
        readiness.problems()
        assert len(checks) == 2
        with TestClient(create_app(settings, client)) as http:
            res = http.get("/readyz")
        assert res.status_code == 503 and "dark" in res.text


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
FIELDS = ["model", "role", "messages", "haco", "stream", "tau", "deadline_s", "launch_mode",
          "winner_mode", "idempotency_key", "wait"]  # fmt: skip
BODIES = (
    JSON
    | st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=5)
    | st.fixed_dictionaries(
        {"model": st.sampled_from(["nobody", "coder"]), "role": st.just("nobody")},
        optional={"messages": JSON, "haco": JSON, "tau": JSON, "stream": JSON},
    )
)


@pytest.fixture(scope="module")
def asgi(served: Served) -> Iterator[TestClient]:
    with TestClient(create_app(served.settings, served.client), raise_server_exceptions=False) as c:
        yield c


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(["/v1/chat/completions", "/v1/invocations"]), body=BODIES)
def test_fuzzed_bodies_are_never_a_5xx(asgi: TestClient, path: str, body: Any) -> None:
    data = json.dumps(body, allow_nan=True).encode()
    res = asgi.post(path, content=data, headers={**auth(), "content-type": "application/json"})
    assert res.status_code < 500 or res.status_code in (502, 504), res.text
    if res.status_code >= 400:
        assert set(res.json()["error"]) >= {"message", "type", "param", "code"}


def test_readiness_checks_the_trace_store_when_one_is_configured(
    served: Served, pg_url: str
) -> None:
    def problems(database_url: str) -> list[str]:
        settings = served.settings.model_copy(update={"database_url": database_url})
        return Readiness(served.client, settings).problems()

    assert problems(pg_url) == []
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"postgresql://postgres@127.0.0.1:{sock.getsockname()[1]}/nothing"
        (problem,) = problems(dead)
    assert "cannot connect to Postgres" in problem


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(invocation_id=st.text(min_size=1, max_size=40))
def test_fuzzed_invocation_ids_are_never_a_5xx(asgi: TestClient, invocation_id: str) -> None:
    res = asgi.get(f"/v1/invocations/{quote(invocation_id, safe='')}", headers=auth())
    # An id of "/" decodes to the collection's path, where GET is not a method: 405.
    assert res.status_code in (200, 400, 404, 405), res.text
    if res.status_code >= 400:
        assert res.json()["error"]["message"], res.text
