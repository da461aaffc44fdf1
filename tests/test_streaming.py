"""Streaming hedged on the first token (issue 9, coordinator/runtime/streaming.py): the
service of tests/test_api.py, a role whose two fake candidates race, one streaming at
once and one that never sends a byte."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from fake_openai import ANSWER, WORDS
from polling import wait_for
from test_api import ZONE, Served, auth, served

from coordinator.state.memstore import MemoryStore
from schemas.enums import FailureKind
from workers.backends.base import BackendResult
from workers.streamsink import ChunkSink

__all__ = ["served"]  # the module-scoped service fixture of tests/test_api.py

RACE = {"haco": {"winner_mode": "first", "launch_mode": "parallel", "tau": 0.999}}


def sse_data(lines: list[str]) -> list[str]:
    return [line[len("data: ") :] for line in lines if line.startswith("data: ")]


@pytest.fixture(autouse=True)
def cancelling(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """The service's coordinator cancels losers (HACO_CANCEL_LOSERS): a relay does so at
    the first token (so no hanging loser outlives its test either)."""
    coord = served.client.coordinator
    monkeypatch.setattr(
        coord, "settings", coord.settings.model_copy(update={"cancel_losers": True})
    )


def test_the_first_token_wins_and_its_deltas_are_relayed_intact(served: Served) -> None:
    hangs = len(served.fake.of("hang:race"))
    body = {"model": "race", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream(
        "POST", f"{served.url}/v1/chat/completions", json={**body, **RACE}, headers=auth(),
        timeout=30.0,
    ) as response:  # fmt: skip
        assert response.status_code == 200, response.read()
        assert response.headers["x-haco-candidate"] == "r-ok"
        assert response.headers["x-haco-zone"] == ZONE
        assert response.headers["x-haco-stream"].startswith("relayed")
        data = sse_data(list(response.iter_lines()))
    assert data[-1] == "[DONE]"
    events = [json.loads(d) for d in data[:-1]]
    deltas = [e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]]
    # exactly the fake's streamed text, in order (the worker forwards each read's deltas)
    assert "".join(deltas) == ANSWER == WORDS[0] + "".join(" " + w for w in WORDS[1:])
    assert events[-1]["usage"]["completion_tokens"] == 9  # the fake's usage, relayed
    assert events[-1]["id"] == f"chatcmpl-{response.headers['x-haco-invocation-id']}"
    # the loser was cancelled: its connection is seen closed by the fake server (its
    # 10 s read timeout is far off: the wait below would outlast it only on a failure)
    wait_for("the slow member's request", lambda: len(served.fake.of("hang:race")) > hangs, 20)
    slow = served.fake.of("hang:race")[-1]
    wait_for("the slow member's connection to close", slow.client_closed.is_set, 20)


def test_the_openai_sdk_consumes_a_relayed_stream(served: Served) -> None:
    sdk = openai.OpenAI(base_url=f"{served.url}/v1", api_key=served_token(), max_retries=0)
    stream = sdk.chat.completions.create(
        model="race", messages=[{"role": "user", "content": "hi"}], stream=True, extra_body=RACE
    )
    parts = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(parts) == ANSWER


def test_another_winner_rule_is_buffered_and_says_so(served: Served) -> None:
    body = {"model": "coder", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream(
        "POST", f"{served.url}/v1/chat/completions", json=body, headers=auth(), timeout=30.0
    ) as response:
        assert response.status_code == 200
        assert response.headers["x-haco-stream"].startswith("buffered")
        data = sse_data(list(response.iter_lines()))
    assert data[-1] == "[DONE]"


def test_a_winner_failing_mid_stream_ends_it_with_an_error_event(served: Served) -> None:
    body = {"model": "cut", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream(
        "POST", f"{served.url}/v1/chat/completions", json={**body, **RACE}, headers=auth(),
        timeout=30.0,
    ) as response:  # fmt: skip
        assert response.status_code == 200, response.read()
        assert response.headers["x-haco-candidate"] == "x-stall"
        data = sse_data(list(response.iter_lines()))
    assert data[-1] == "[DONE]"
    events = [json.loads(d) for d in data[:-1]]
    deltas = [e["choices"][0]["delta"].get("content") or "" for e in events[:-1]]
    assert "".join(deltas) == "".join(w + " " for w in WORDS[:3])  # what the fake sent
    assert events[-1]["error"]["code"] == "winner_failed"
    assert "timeout" in events[-1]["error"]["message"].lower()
    sdk = openai.OpenAI(base_url=f"{served.url}/v1", api_key=served_token(), max_retries=0)
    stream = sdk.chat.completions.create(
        model="cut", messages=[{"role": "user", "content": "hi"}], stream=True, extra_body=RACE
    )
    with pytest.raises(openai.APIError, match=r"(?i)timeout"):
        for _ in stream:
            pass


def test_a_member_that_does_not_stream_sends_its_output_as_one_delta() -> None:
    store = MemoryStore()
    sink = ChunkSink(store, "k", 60.0)
    sink.end(BackendResult(None, output="whole answer", tokens_in=3, tokens_out=2))
    assert store.chunks["k"] == [
        {"d": "whole answer"},
        {"end": "ok", "reason": "", "tokens_in": "3", "tokens_out": "2"},
    ]
    sink = ChunkSink(store, "s", 60.0)
    sink(["a", "b"])  # one read's deltas: one entry
    sink([])
    sink.end(BackendResult(FailureKind.TIMEOUT, "read timed out", output="ab"))
    assert [e.get("d") for e in store.chunks["s"]] == ["ab", None]
    assert store.chunks["s"][-1]["end"] == "failed"


def served_token() -> str:
    return auth()["authorization"].removeprefix("Bearer ")
