"""The real model backends (workers/backends/openai.py) against a real HTTP server on
127.0.0.1 (tests/fake_openai.py): the OpenAI and Azure forms, plain and streamed,
every failure classified, Retry-After as a cooldown the planning respects, cancellation
that closes the connection, and an API key that never leaves the request header."""

from __future__ import annotations

import itertools
import json
import logging
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import redis
from fake_openai import ANSWER, FakeServer
from hypothesis import given
from hypothesis import strategies as st
from polling import wait_for
from psycopg_pool import ConnectionPool
from pydantic import ValidationError
from runtime_helpers import build_runtime, invocation

from coordinator.config import HacoSettings
from coordinator.errors import AllFailedError
from coordinator.runtime.coordinator import Coordinator
from coordinator.runtime.dispatch import ThreadDispatcher
from coordinator.runtime.pool import Pool, load_pool
from coordinator.state import keys
from coordinator.state.budget import MemoryBudget
from coordinator.state.hedgedelay import MemoryDelayWindow
from coordinator.state.memstore import MemoryStore
from coordinator.state.store import RedisStore
from coordinator.tracestore.harvester import Harvester
from schemas.enums import FailureKind, GroupSignal, MemberStatus
from schemas.export import render
from schemas.models import BackendSpec, Candidate, MemberTask, Message
from workers.app import WorkerRuntime
from workers.backends.base import BackendResult, StopCheck
from workers.backends.http_errors import approx_tokens, retry_after_s
from workers.backends.openai import ChatBackend
from workers.backends.sse import SSEParser
from workers.backends.transport import PoolLimits, make_client
from workers.member import MemberContext, execute_member

KEY = "sk-test-SECRET-1234"
ENV = {"HACO_TEST_KEY": KEY}
PROMPT = [Message(role="user", content="say hello in a few words")]
FAST = {"read_timeout_s": 2.0, "stop_poll_s": 0.01}


@pytest.fixture(scope="module")
def server() -> Iterator[FakeServer]:
    srv = FakeServer().start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    c = make_client(PoolLimits(64, 16, 30.0))
    yield c
    c.close()


def openai(server: FakeServer, behaviour: str, stream: bool = False, **settings: Any) -> Candidate:
    s = {"base_url": f"{server.url}/v1", "api_key_env": "HACO_TEST_KEY", "stream": stream}
    return Candidate(
        id=f"oa-{behaviour}", role="coder", model=behaviour, zone="local",
        backend=BackendSpec(kind="openai", settings={**s, **FAST, **settings}),
    )  # fmt: skip


def azure(server: FakeServer, deployment: str, stream: bool = False, **settings: Any) -> Candidate:
    s = {"endpoint": server.url, "deployment": deployment, "api_key_env": "HACO_TEST_KEY",
         "stream": stream, "api_version": "2024-10-21"}  # fmt: skip
    return Candidate(
        id=f"az-{deployment}", role="coder", model="gpt-4o", zone="local",
        backend=BackendSpec(kind="azure", settings={**s, **FAST, **settings}),
    )  # fmt: skip


def task(cand: Candidate, group: str = "g1") -> MemberTask:
    now = time.time()
    return MemberTask(
        group_id=group, member_id=f"{group}.0", rank=0, candidate=cand, caller_zone="local",
        payload=PROMPT, deadline_at_s=now + 60, enqueued_at_s=now,
    )  # fmt: skip


def call(
    client: httpx.Client, cand: Candidate, should_stop: StopCheck = lambda: False
) -> BackendResult:
    return ChatBackend(cand, client, ENV).call(task(cand), should_stop)


# ---------------------------------------------------------------- the protocol


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_openai_form_sends_model_bearer_key_and_reads_the_answer(
    server: FakeServer, client: httpx.Client, stream: bool
) -> None:
    res = call(client, openai(server, "ok", stream, max_tokens=64, temperature=0.3))
    assert (res.failure, res.output) == (None, ANSWER)
    assert (res.tokens_in, res.tokens_out) == (11, 9)  # the server's usage
    rec = server.of("ok")[-1]
    assert rec.path == "/v1/chat/completions" and rec.query == ""
    assert rec.headers["authorization"] == f"Bearer {KEY}" and "api-key" not in rec.headers
    assert rec.body["messages"] == [{"role": "user", "content": PROMPT[0].content}]
    assert (rec.body["max_tokens"], rec.body["temperature"]) == (64, 0.3)
    if stream:
        assert rec.body["stream"] is True
        assert rec.body["stream_options"] == {"include_usage": True}
    else:
        assert "stream" not in rec.body
    assert res.bytes_sent == len(json.dumps(rec.body, ensure_ascii=False).encode("utf-8"))
    assert res.proc_latency_s is not None and res.proc_latency_s > 0


def test_extra_body_fields_reach_the_server_but_cannot_override_haco_s(
    server: FakeServer, client: httpx.Client
) -> None:
    fmt = {"type": "json_object", "schema": {"type": "object"}}
    res = call(client, openai(server, "ok", extra_body={"response_format": fmt, "seed": 7}))
    assert res.failure is None
    rec = server.of("ok")[-1]
    assert (rec.body["response_format"], rec.body["seed"]) == (fmt, 7)
    with pytest.raises(ValidationError, match=r"extra_body sets \['messages'\]"):
        openai(server, "ok", extra_body={"messages": []})


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_azure_form_uses_the_deployment_path_api_version_and_api_key_header(
    server: FakeServer, client: httpx.Client, stream: bool
) -> None:
    res = call(client, azure(server, "ok", stream))
    assert (res.failure, res.output, res.tokens_out) == (None, ANSWER, 9)
    rec = server.of("ok")[-1]
    assert rec.path == "/openai/deployments/ok/chat/completions"
    assert rec.query == "api-version=2024-10-21"
    assert rec.headers["api-key"] == KEY and "authorization" not in rec.headers
    assert "model" not in rec.body


def test_odd_sse_chunking_gives_the_same_answer(server: FakeServer, client: httpx.Client) -> None:
    res = call(client, openai(server, "odd-sse", stream=True))
    assert (res.failure, res.output, res.tokens_in, res.tokens_out) == (None, ANSWER, 11, 9)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_without_usage_tokens_are_counted_from_the_text(
    server: FakeServer, client: httpx.Client, stream: bool
) -> None:
    res = call(client, openai(server, "no-usage", stream))
    assert res.failure is None and res.output == ANSWER
    assert res.tokens_out == approx_tokens(ANSWER) == 13  # 49 characters / 4, rounded up
    assert res.tokens_in == approx_tokens(PROMPT[0].content)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_finished_call_leaves_its_connection_for_the_next(
    server: FakeServer, client: httpx.Client, stream: bool
) -> None:
    cand = openai(server, "odd-sse", stream)
    first, second = call(client, cand), call(client, cand)
    assert first.failure is None and second.failure is None
    a, b = server.of("odd-sse")[-2:]
    assert a.peer == b.peer  # drained to the end (after [DONE]): kept alive, reused


def test_the_token_estimate_is_a_quarter_of_the_characters_at_least_a_word_each() -> None:
    assert [approx_tokens(t) for t in ("", "a", "abcd", "abcde", "a b c d e")] == [0, 1, 1, 2, 5]


# ---------------------------------------------------------------- failures

FAILURES = [
    ("500", FailureKind.SERVER_ERROR, "HTTP 500"),
    ("503", FailureKind.SERVER_ERROR, "HTTP 503"),
    ("rate-limit", FailureKind.RATE_LIMITED, "HTTP 429"),
    ("reset", FailureKind.NETWORK, "transport failed"),
    ("bad-json", FailureKind.INVALID_RESPONSE, "not"),
    ("filtered", FailureKind.CONTENT_FILTERED, "content_filter"),
    ("filtered-400", FailureKind.CONTENT_FILTERED, "HTTP 400 content_filter"),
    ("stall", FailureKind.TIMEOUT, "read timed out"),
    ("hang", FailureKind.TIMEOUT, "read timed out"),
]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize(("behaviour", "kind", "said"), FAILURES, ids=[f[0] for f in FAILURES])
def test_every_failure_is_classified(
    server: FakeServer,
    client: httpx.Client,
    behaviour: str,
    kind: FailureKind,
    said: str,
    stream: bool,
) -> None:
    res = call(client, openai(server, behaviour, stream, read_timeout_s=0.3))
    assert res.failure is kind, res.reason
    assert res.reason is not None and said in res.reason
    assert res.lost is (kind is FailureKind.NETWORK)
    assert res.bytes_sent > 0 and res.output is None
    if res.reason.startswith("HTTP"):  # refused by the service: no tokens spent
        assert (res.tokens_in, res.tokens_out) == (0, 0)


def test_a_hung_or_stalled_call_is_closed_after_the_read_timeout(
    server: FakeServer, client: httpx.Client
) -> None:
    before = len(server.of("hang"))
    assert call(client, azure(server, "hang", read_timeout_s=0.2)).failure is FailureKind.TIMEOUT
    rec = server.of("hang")[before]
    wait_for("the server to see the connection closed", rec.client_closed.is_set, 10.0)


def test_the_total_timeout_bounds_a_call_that_keeps_the_connection_alive(
    server: FakeServer, client: httpx.Client
) -> None:
    cand = openai(server, "stall", True, read_timeout_s=30.0, connect_timeout_s=0.1,
                  total_timeout_s=0.3)  # fmt: skip
    res = call(client, cand)
    assert res.failure is FailureKind.TIMEOUT and "total timeout" in (res.reason or "")
    assert res.tokens_out > 0  # what came before the stall is counted


def test_refused_connection_is_a_network_failure(client: httpx.Client) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens there
    cand = Candidate(
        id="nobody", role="coder", model="m", zone="local",
        backend=BackendSpec(kind="openai", settings={"base_url": f"http://127.0.0.1:{port}"}),
    )  # fmt: skip
    res = call(client, cand)
    assert res.failure is FailureKind.NETWORK and res.lost and "ConnectError" in (res.reason or "")


def test_a_missing_key_variable_fails_naming_the_variable(
    server: FakeServer, client: httpx.Client
) -> None:
    cand = openai(server, "ok")
    res = ChatBackend(cand, client, {}).call(task(cand), lambda: False)
    assert res.failure is FailureKind.INTERNAL and "HACO_TEST_KEY is not set" in (res.reason or "")


# ---------------------------------------------------------------- Retry-After


@pytest.mark.parametrize(
    ("behaviour", "settings", "want"),
    [
        ("rate-limit", {}, 7.0),
        ("rate-limit-ms", {}, 1.5),
        ("rate-limit", {"cooldown_max_s": 5.0}, 5.0),
    ],
)
def test_a_429_carries_its_retry_after_capped(
    server: FakeServer, client: httpx.Client, behaviour: str, settings: dict[str, Any], want: float
) -> None:
    res = call(client, openai(server, behaviour, **settings))
    assert res.failure is FailureKind.RATE_LIMITED and res.retry_after_s == want


def test_a_429_with_an_http_date_waits_until_that_date(
    server: FakeServer, client: httpx.Client
) -> None:
    cand = openai(server, "rate-limit-date")
    # The server says "now + 30 s" on its clock; the backend reads it on an injected one.
    res = ChatBackend(cand, client, ENV, clock=lambda: 0.0).call(task(cand), lambda: False)
    assert res.retry_after_s == 300.0  # the date is far after 0: capped at cooldown_max_s
    later = ChatBackend(cand, client, ENV, clock=lambda: time.time() + 3600)
    res = later.call(task(cand), lambda: False)
    assert res.failure is FailureKind.RATE_LIMITED and res.retry_after_s is None  # past: none


def test_retry_after_forms() -> None:
    date = "Wed, 21 Oct 2015 07:28:00 GMT"  # 1445412480
    at = 1445412480.0
    assert retry_after_s(httpx.Headers({"retry-after": date}), at - 12.0) == 12.0
    assert retry_after_s(httpx.Headers({"retry-after": date}), at + 5.0) == 0.0
    assert retry_after_s(httpx.Headers({"retry-after": "3"}), 0.0) == 3.0
    assert retry_after_s(httpx.Headers({"retry-after": "soon"}), 0.0) is None
    assert retry_after_s(httpx.Headers({"retry-after": "-1"}), 0.0) is None
    assert retry_after_s(httpx.Headers({"retry-after-ms": "250", "retry-after": "9"}), 0.0) == 0.25
    assert retry_after_s(httpx.Headers(), 0.0) is None


# ---------------------------------------------------------------- cancellation


def stop_after_stall(server: FakeServer, behaviour: str, checks_after: int = 3) -> StopCheck:
    """Says stop a few checks after the server has sent all it will and stalls (what it
    sent is in the client's socket by then: a read after a check takes it in)."""
    seen = [0]
    before = len(server.of(behaviour))

    def should_stop() -> bool:
        recs = server.of(behaviour)[before:]
        if recs and recs[0].stalling.is_set():
            seen[0] += 1
        return seen[0] > checks_after

    return should_stop


def test_cancel_mid_stream_closes_the_connection_and_keeps_the_tokens(
    server: FakeServer, client: httpx.Client
) -> None:
    before = len(server.of("stall"))
    cand = openai(server, "stall", stream=True, read_timeout_s=30.0)
    res = call(client, cand, stop_after_stall(server, "stall"))
    assert res.failure is FailureKind.CANCELLED and res.tokens_out > 0, res
    rec = server.of("stall")[before]
    wait_for("the server to see the cancelled call's connection closed",
             rec.client_closed.is_set, 10.0)  # fmt: skip


@pytest.mark.parametrize("behaviour", ["hang", "stall"])
def test_cancel_while_waiting_for_headers_or_a_plain_body(
    server: FakeServer, client: httpx.Client, behaviour: str
) -> None:
    before = len(server.of(behaviour))
    cand = openai(server, behaviour, read_timeout_s=30.0)
    res = call(client, cand, stop_after_stall(server, behaviour))
    assert res.failure is FailureKind.CANCELLED
    rec = server.of(behaviour)[before]
    wait_for("the server to see the connection closed", rec.client_closed.is_set, 10.0)


class CancelledOnceCalled(MemoryStore):
    """A store whose open group reads as cancelled once ``stop`` says so."""

    def __init__(self, stop: StopCheck) -> None:
        super().__init__()
        self.stop = stop

    def group_state(self, group_id: str) -> GroupSignal | None:
        state = super().group_state(group_id)
        return GroupSignal.CANCELLED if state is GroupSignal.OPEN and self.stop() else state


def test_a_cancelled_member_reports_its_tokens(server: FakeServer, client: httpx.Client) -> None:
    """Through the member: the trace says CANCELLED with the tokens the call produced."""
    store = CancelledOnceCalled(stop_after_stall(server, "stall"))
    store.open_group("gc", 60.0)
    cand = openai(server, "stall", stream=True, read_timeout_s=30.0)
    backend = ChatBackend(cand, client, ENV)
    ctx = MemberContext(store=store, backends=lambda _t: backend, settings=HacoSettings())
    report = execute_member(task(cand, "gc"), ctx)
    t = report.trace
    assert (t.status, t.failure_kind) == (MemberStatus.CANCELLED, FailureKind.CANCELLED)
    assert t.tokens_out > 0 and t.bytes_sent > 0 and report.output is None


# ---------------------------------------------------------------- SSE, mock transport


EVENTS = [json.dumps({"n": i, "s": "é" * i}) for i in range(6)]


@given(st.lists(st.integers(min_value=0, max_value=400), max_size=12), st.booleans())
def test_sse_parser_gives_the_same_events_however_the_bytes_are_split(
    cuts: list[int], crlf: bool
) -> None:
    raw = b": hello\n\n" + b"".join(f"data: {e}\n\n".encode() for e in EVENTS)
    raw += b"event: x\ndata: a\ndata: b\n\n"
    if crlf:
        raw = raw.replace(b"\n", b"\r\n")
    bounds = sorted({min(c, len(raw)) for c in cuts} | {0, len(raw)})
    parser, got = SSEParser(), []
    for a, b in itertools.pairwise(bounds):
        got += list(parser.feed(raw[a:b]))
    got += list(parser.close())
    assert got == [*EVENTS, "a\nb"]


def mock(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(handler))


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        ({"choices": []}, FailureKind.INVALID_RESPONSE),
        ({"choices": ["text"]}, FailureKind.INVALID_RESPONSE),
        ([1, 2], FailureKind.INVALID_RESPONSE),
        ({"error": {"code": "content_filter", "message": "no"}}, FailureKind.CONTENT_FILTERED),
        ({"choices": [{"message": {"content": "hi"}, "finish_reason": "length"}]}, None),
    ],
)
def test_body_shapes_with_a_mock_transport(body: Any, kind: FailureKind | None) -> None:
    spec = BackendSpec(kind="openai", settings={"base_url": "http://mock/v1"})
    cand = Candidate(id="m", role="coder", model="m", zone="local", backend=spec)
    with mock(lambda _r: httpx.Response(200, json=body)) as c:
        res = ChatBackend(cand, c, {}).call(task(cand), lambda: False)
    assert res.failure is kind, res.reason


# ---------------------------------------------------------------- settings


def test_backend_settings_are_validated_per_kind() -> None:
    with pytest.raises(ValidationError, match="base_url"):
        BackendSpec(kind="openai", settings={"base_url": "ftp://x"})
    with pytest.raises(ValidationError, match="read_timout_s"):
        BackendSpec(kind="openai", settings={"base_url": "http://x", "read_timout_s": 1})
    with pytest.raises(ValidationError, match="deployment"):
        BackendSpec(kind="azure", settings={"endpoint": "https://x.openai.azure.com"})
    with pytest.raises(ValidationError, match="api_key_env"):
        BackendSpec(kind="openai", settings={"base_url": "http://x", "api_key_env": "sk-1"})
    with pytest.raises(ValidationError, match="total_timeout_s"):
        BackendSpec(kind="openai", settings={"base_url": "http://x", "connect_timeout_s": 9,
                                              "total_timeout_s": 2})  # fmt: skip
    with pytest.raises(ValidationError, match="kind"):
        BackendSpec(kind="grpc")


def test_the_example_endpoint_pool_loads() -> None:
    example = Path(__file__).resolve().parent.parent / "docs/examples/endpoints_pool.toml"
    config = load_pool(example)
    assert [c.backend.kind for c in config.candidates] == ["openai", "azure", "azure"]
    assert KEY not in example.read_text() and "api_key =" not in example.read_text()


def pool_toml(server: FakeServer, models: list[str], tmp_path: Path) -> Path:
    cands = "".join(
        f"""
[[candidates]]
id = "c-{m}"
role = "coder"
model = "{m}"
zone = "local"
[candidates.backend]
kind = "openai"
[candidates.backend.settings]
base_url = "{server.url}/v1"
api_key_env = "HACO_TEST_KEY"
stream = true
read_timeout_s = 5.0
"""
        for m in models
    )
    path = tmp_path / "pool.toml"
    path.write_text(f'caller_zone = "local"\nzones = ["local"]\n{cands}')
    return path


class WorkerBackends:
    """The worker's own backend choice (WorkerRuntime.backend_for_candidate), as the
    in-process runtime's single backend."""

    def __init__(self, runtime: WorkerRuntime) -> None:
        self.runtime = runtime

    def call(self, task: MemberTask, should_stop: StopCheck) -> BackendResult:
        return self.runtime.backend_for_candidate(task.candidate).call(task, should_stop)

    def commit(self, task: MemberTask) -> None:
        self.runtime.backend_for_candidate(task.candidate).commit(task)


def test_the_worker_builds_one_backend_per_candidate_on_one_client(
    server: FakeServer, tmp_path: Path
) -> None:
    pool = load_pool(pool_toml(server, ["ok", "no-usage"], tmp_path))
    rt = WorkerRuntime(HacoSettings(), "redis://127.0.0.1:1/0")  # Redis is never reached
    a, b = (rt.backend_for_candidate(c) for c in pool.candidates)
    assert isinstance(a, ChatBackend) and isinstance(b, ChatBackend) and a is not b
    assert rt.backend_for_candidate(pool.candidates[0]) is a
    assert a.client is b.client is rt.http_client()
    rt.http_client().close()


# ---------------------------------------------------------------- end to end


def test_end_to_end_a_429_candidate_cools_down_and_is_left_out(
    server: FakeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HACO_TEST_KEY", KEY)
    pool = Pool(load_pool(pool_toml(server, ["rate-limit", "ok"], tmp_path)))
    worker = WorkerRuntime(HacoSettings(), "redis://127.0.0.1:1/0")
    rt = build_runtime(WorkerBackends(worker), pool, default_deadline_s=20.0)
    now = [1000.0]
    rt.store.clock = lambda: now[0]
    limited = len(server.of("rate-limit"))
    try:
        first = rt.invoke()
        assert (first.candidate_id, first.output) == ("c-ok", ANSWER)
        assert {m.candidate_id for m in first.members} == {"c-rate-limit", "c-ok"}  # cold
        wait_for("the 429 member to report", lambda: len(rt.reports()) == 2, 10.0)
        assert rt.store.cooling(["c-rate-limit", "c-ok"]) == {"c-rate-limit"}
        second = rt.invoke()
        assert [m.candidate_id for m in second.members] == ["c-ok"]  # excluded
        assert len(server.of("rate-limit")) == limited + 1
        now[0] += 7.5  # Retry-After: 7 has passed
        third = rt.invoke()
        assert {m.candidate_id for m in third.members} == {"c-rate-limit", "c-ok"}
    finally:
        rt.dispatcher.close()
        worker.http_client().close()


def test_when_every_candidate_cools_down_the_planning_ignores_the_cooldowns(
    server: FakeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HACO_TEST_KEY", KEY)
    pool = Pool(load_pool(pool_toml(server, ["rate-limit", "rate-limit-ms"], tmp_path)))
    worker = WorkerRuntime(HacoSettings(), "redis://127.0.0.1:1/0")
    rt = build_runtime(WorkerBackends(worker), pool, default_deadline_s=20.0)
    rt.store.clock = lambda: 0.0
    try:
        for _ in range(2):
            with pytest.raises(AllFailedError, match="HTTP 429") as info:
                rt.invoke()
            assert len(info.value.failures) == 2  # both planned, cooling or not
        assert rt.store.cooling(["c-rate-limit", "c-rate-limit-ms"]) == {
            "c-rate-limit", "c-rate-limit-ms"}  # fmt: skip
    finally:
        rt.dispatcher.close()
        worker.http_client().close()


# ---------------------------------------------------------------- secrets


def everything_in_redis(r: redis.Redis) -> str:
    out = []
    for name in r.scan_iter(count=1000):
        raw, kind = r.type(name), ""
        kind = raw.decode() if isinstance(raw, bytes) else str(raw)
        out.append(name.decode())
        if kind == "string":
            out.append(repr(r.get(name)))
        elif kind == "hash":
            out.append(repr(r.hgetall(name)))
        elif kind == "list":
            out.append(repr(r.lrange(name, 0, -1)))
        elif kind == "stream":
            out.append(repr(r.xrange(name)))
        elif kind == "set":
            out.append(repr(r.smembers(name)))
        elif kind == "zset":
            out.append(repr(r.zrange(name, 0, -1, withscores=True)))
    return "\n".join(out)


def test_the_api_key_appears_nowhere_but_in_the_request(
    server: FakeServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    r: redis.Redis,
    pool: ConnectionPool,
    db: str,
) -> None:
    monkeypatch.setenv("HACO_TEST_KEY", KEY)
    caplog.set_level(logging.DEBUG)
    models = ["ok", "echo-auth", "rate-limit", "500", "filtered-400", "bad-json"]
    config = load_pool(pool_toml(server, models, tmp_path))
    settings = HacoSettings(default_deadline_s=20.0, harvest_block_ms=20)
    worker = WorkerRuntime(settings, "redis://127.0.0.1:1/0")
    store = RedisStore(r)
    ctx = MemberContext(store=store, backends=lambda t: worker.backend_for_candidate(t.candidate),
                        settings=settings)  # fmt: skip
    dispatcher = ThreadDispatcher(lambda t: execute_member(t, ctx), frozenset(["local"]), 8)
    coord = Coordinator(Pool(config), store, dispatcher, MemoryBudget(settings),
                        MemoryDelayWindow(settings), settings)  # fmt: skip
    failing: Coordinator | None = None
    try:
        assert coord.invoke(invocation()).output == ANSWER
        errors = []
        config_429 = config.model_copy(update={"candidates": config.candidates[1:]})
        failing = Coordinator(Pool(config_429), store, dispatcher, MemoryBudget(settings),
                              MemoryDelayWindow(settings), settings)  # fmt: skip
        with pytest.raises(AllFailedError) as info:
            failing.invoke(invocation())
        errors.append(str(info.value))
        assert "Bearer ***" in errors[0]
        for f in list(dispatcher.futures):
            f.result(timeout=20.0)
    finally:
        dispatcher.close()
        worker.http_client().close()
        coord.close()  # no lost-member record fires into a later test's database
        if failing is not None:
            failing.close()
    echoed = server.of("echo-auth")
    assert echoed and echoed[0].headers["authorization"] == f"Bearer {KEY}"  # it was sent
    stored = everything_in_redis(r)
    assert "echo-auth" in stored and "Incorrect API key provided: Bearer ***" in stored
    assert keys.cooldown("c-rate-limit") in stored and keys.METRICS in stored
    while Harvester(r, pool, settings, "h").run_once():
        pass
    with psycopg.connect(db) as conn:
        rows = conn.execute("SELECT m::text FROM members m").fetchall()
        rows += conn.execute("SELECT i::text FROM invocations i").fetchall()
        rows += conn.execute("SELECT l::text FROM link_observations l").fetchall()
    assert len(rows) > 6
    exported = "\n".join(render().values())
    for where, text in [("redis", stored), ("postgres", repr(rows)), ("logs", caplog.text),
                        ("errors", repr(errors)), ("schemas", exported),
                        ("metrics", repr(store.metrics()))]:  # fmt: skip
        assert KEY not in text and "SECRET" not in text, where
