"""Real model endpoints: any OpenAI-compatible server (``backend.kind = "openai"``) and
Azure OpenAI (``"azure"``), plain or streamed, on the worker's shared ``httpx.Client``.

- ``openai``: POST ``{base_url}/chat/completions``, ``Authorization: Bearer <key>``,
  the model in the body. ``azure``: POST ``{endpoint}/openai/deployments/{deployment}/
  chat/completions?api-version=…`` with an ``api-key`` header.
- The key is read from the environment variable ``api_key_env`` at call time and goes
  nowhere but the request header: every reason is passed through ``redact``.
- Both forms are read incrementally (``client.send(stream=True)``): the cancel check
  runs between chunks, and while no byte arrives — the wait for the headers too — every
  ``stop_poll_s`` (:mod:`workers.backends.transport`). A stop closes the connection, so
  the server stops generating; the member reports CANCELLED with the tokens it had
  received.
- Streams ask for ``stream_options: {"include_usage": true}`` and take the usage from
  the final chunk. Without a usage, tokens are estimated from the text
  (:func:`workers.backends.http_errors.approx_tokens`).
- Failures are classified by :mod:`workers.backends.http_errors`; a 429's Retry-After
  becomes ``BackendResult.retry_after_s`` (the candidate's cooldown).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from schemas.backends import AzureSettings, OpenAISettings
from schemas.enums import FailureKind
from schemas.models import Candidate, MemberTask
from workers.backends.base import BackendResult, DeltaSink, StopCheck
from workers.backends.http_errors import (
    CONTENT_FILTER_CODES,
    Cooldown,
    Failure,
    approx_tokens,
    error_of,
    from_exception,
    from_status,
    redact,
)
from workers.backends.sse import SSEParser
from workers.backends.transport import StopRequested, TotalTimeout, Watch, watching

ERROR_BODY_BYTES = 65_536  # of a failed response's body read for its error message
Settings = OpenAISettings | AzureSettings


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where and how a candidate's calls go."""

    url: str
    params: dict[str, str]
    key_header: str
    key_prefix: str
    model: str | None  # in the body (OpenAI); Azure's deployment names the model
    settings: Settings


def endpoint_for(candidate: Candidate) -> Endpoint:
    spec = candidate.backend
    if spec.kind == "azure":
        az = AzureSettings.model_validate(spec.settings)
        url = f"{az.endpoint.rstrip('/')}/openai/deployments/{az.deployment}/chat/completions"
        return Endpoint(url, {"api-version": az.api_version}, "api-key", "", None, az)
    oa = OpenAISettings.model_validate(spec.settings)
    url = f"{oa.base_url.rstrip('/')}/chat/completions"
    return Endpoint(url, {}, "Authorization", "Bearer ", oa.model or candidate.model, oa)


@dataclass
class _Reply:
    """What was received so far."""

    parts: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    done: bool = False  # [DONE], or a whole JSON body
    accepted: bool = False  # a 2xx response: the service took the call
    error: tuple[str, str] | None = None  # (code, message) of an error in the body

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def take(self, obj: Any, delta_key: str) -> None:
        """One JSON object: a stream chunk (``delta``) or a whole body (``message``)."""
        if not isinstance(obj, dict):
            raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
        if "error" in obj:
            self.error = error_of(obj)
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        choices = obj.get("choices") or []
        if not isinstance(choices, list):
            raise ValueError("'choices' is not a list")
        for choice in choices[:1]:
            if not isinstance(choice, dict):
                raise ValueError(f"a choice is a {type(choice).__name__}, not an object")
            part = choice.get(delta_key) or {}
            content = part.get("content") if isinstance(part, dict) else None
            if isinstance(content, str):
                self.parts.append(content)
            self.finish_reason = choice.get("finish_reason") or self.finish_reason

    def tokens(self, prompt_tokens: int) -> tuple[int, int]:
        """(in, out): the usage the server reported, else estimates; none for a call
        the service refused (no 2xx) and that reported no usage."""
        if self.usage is None and not self.accepted:
            return 0, 0
        usage = self.usage or {}
        t_in, t_out = usage.get("prompt_tokens"), usage.get("completion_tokens")
        return (
            t_in if isinstance(t_in, int) and t_in >= 0 else prompt_tokens,
            t_out if isinstance(t_out, int) and t_out >= 0 else approx_tokens(self.text),
        )


class ChatBackend:
    """A candidate's chat-completions endpoint (workers.backends.base.Backend)."""

    def __init__(
        self,
        candidate: Candidate,
        client: httpx.Client,
        environ: Mapping[str, str] = os.environ,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.candidate = candidate
        self.endpoint = endpoint_for(candidate)
        self.client = client
        self.environ = environ
        self.clock = clock

    def commit(self, task: MemberTask) -> None:
        """A model call has no side effect to commit."""

    def _streams(self, task: MemberTask) -> bool:
        return self.endpoint.settings.stream or task.stream_to is not None

    def _body(self, task: MemberTask) -> dict[str, Any]:
        s = self.endpoint.settings
        temperature = task.candidate.temperature if s.temperature is None else s.temperature
        body: dict[str, Any] = {
            **s.extra_body,
            "messages": [m.model_dump(mode="json") for m in task.payload],
            "temperature": temperature,
        }
        if self.endpoint.model is not None:
            body["model"] = self.endpoint.model
        if s.max_tokens is not None:
            body["max_tokens"] = s.max_tokens
        if self._streams(task):
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    def _key(self) -> tuple[str | None, str | None]:
        """(key, why it is missing)."""
        name = self.endpoint.settings.api_key_env
        if name is None:
            return None, None
        key = self.environ.get(name)
        return (key, None) if key else (None, f"the environment variable {name} is not set")

    def call(self, task: MemberTask, should_stop: StopCheck) -> BackendResult:
        return self.call_streamed(task, should_stop, None)

    def call_streamed(
        self, task: MemberTask, should_stop: StopCheck, sink: DeltaSink | None
    ) -> BackendResult:
        """:meth:`call`, each read's content deltas handed to ``sink`` as they arrive (a
        relayed stream, workers.streamsink); the endpoint is asked to stream."""
        start = time.monotonic()
        payload = json.dumps(self._body(task), ensure_ascii=False).encode("utf-8")
        prompt_tokens = approx_tokens("\n".join(m.content for m in task.payload))
        key, missing = self._key()
        if missing is not None:
            return BackendResult(FailureKind.INTERNAL, missing, delivered=False)
        reply = _Reply()
        try:
            watch = Watch(should_stop, start + self._total, self._poll)
            failure = self._exchange(payload, key, reply, watch, (self._streams(task), sink))
        except StopRequested:
            failure = Failure(FailureKind.CANCELLED, "cancelled while running: connection closed")
        except TotalTimeout:
            failure = Failure(FailureKind.TIMEOUT, f"total timeout of {self._total} s passed")
        except httpx.HTTPError as exc:
            failure = from_exception(exc)
        return self._result(failure, reply, key, len(payload), prompt_tokens, start)

    @property
    def _total(self) -> float:
        return self.endpoint.settings.total_timeout_s

    @property
    def _poll(self) -> float:
        return self.endpoint.settings.stop_poll_s

    def _request(self, payload: bytes, key: str | None, stream: bool) -> httpx.Request:
        s, ep = self.endpoint.settings, self.endpoint
        headers = {"content-type": "application/json", "accept": "application/json"}
        if stream:
            headers["accept"] = "text/event-stream"
        if key is not None:
            headers[ep.key_header] = f"{ep.key_prefix}{key}"
        timeout = httpx.Timeout(
            connect=s.connect_timeout_s,
            read=s.read_timeout_s,
            write=s.read_timeout_s,
            pool=s.connect_timeout_s,
        )
        return self.client.build_request(
            "POST", ep.url, params=ep.params, content=payload, headers=headers, timeout=timeout
        )

    def _exchange(
        self,
        payload: bytes,
        key: str | None,
        reply: _Reply,
        watch: Watch,
        streaming: tuple[bool, DeltaSink | None],
    ) -> Failure | None:
        """Send, then read the response into ``reply``; the failure, or None."""
        stream, sink = streaming
        with watching(watch):
            watch.check()
            response = self.client.send(self._request(payload, key, stream), stream=True)
            try:
                if not response.is_success:
                    return self._failed(response, watch)
                reply.accepted = True
                sse = "text/event-stream" in response.headers.get("content-type", "")
                if stream and sse:
                    return _read_stream(_chunks(response, watch), reply, sink)
                return _read_body(_chunks(response, watch), reply)
            finally:
                response.close()  # mid-body: the connection is closed, not reused

    def _failed(self, response: httpx.Response, watch: Watch) -> Failure:
        body = bytearray()
        for chunk in _chunks(response, watch):
            body += chunk
            if len(body) >= ERROR_BODY_BYTES:
                break
        s = self.endpoint.settings
        rule = Cooldown(s.cooldown_default_s, s.cooldown_max_s)
        return from_status(response, bytes(body), self.clock(), rule)

    def _result(
        self,
        failure: Failure | None,
        reply: _Reply,
        key: str | None,
        sent: int,
        prompt_tokens: int,
        start: float,
    ) -> BackendResult:
        tokens_in, tokens_out = reply.tokens(prompt_tokens)
        common: dict[str, Any] = {
            "tokens_in": tokens_in,
            "tokens_out": tokens_out,
            "proc_latency_s": time.monotonic() - start,
            "bytes_sent": sent,
        }
        if failure is None:
            return BackendResult(None, output=reply.text, **common)
        return BackendResult(
            failure.kind,
            redact(failure.reason, key),
            retry_after_s=failure.retry_after_s,
            lost=failure.kind is FailureKind.NETWORK,
            **common,
        )


def _chunks(response: httpx.Response, watch: Watch) -> Iterator[bytes]:
    """The body as it arrives, checking the watch after each chunk is taken in (so the
    tokens of a cancelled call include its last chunk)."""
    for chunk in response.iter_bytes():
        yield chunk
        watch.check()


def _outcome(reply: _Reply) -> Failure | None:
    if reply.error is not None:
        code, message = reply.error
        filtered = code in CONTENT_FILTER_CODES
        kind = FailureKind.CONTENT_FILTERED if filtered else FailureKind.SERVER_ERROR
        return Failure(kind, f"error in the response: {code} {message}".strip())
    if reply.finish_reason == "content_filter":
        why = "the output was filtered (finish_reason content_filter)"
        return Failure(FailureKind.CONTENT_FILTERED, why)
    if not reply.done:
        return Failure(FailureKind.INVALID_RESPONSE, "the stream ended before [DONE]")
    if not reply.parts and reply.finish_reason is None:
        return Failure(FailureKind.INVALID_RESPONSE, "the response has no choice")
    return None


def _read_stream(chunks: Iterator[bytes], reply: _Reply, sink: DeltaSink | None) -> Failure | None:
    parser = SSEParser()
    reads = (parser.feed(chunk) for chunk in chunks)
    sent = 0
    try:
        for events in _ended(reads, parser):
            for data in events:
                _event(data, reply)
            if sink is not None and len(reply.parts) > sent:  # one hand-over per read
                sink(reply.parts[sent:])
                sent = len(reply.parts)
    except ValueError as exc:
        return Failure(FailureKind.INVALID_RESPONSE, f"a stream event is not a chunk: {exc}")
    if reply.finish_reason is not None and not reply.done:
        reply.done = True  # a server that ends the stream without [DONE]
    return _outcome(reply)


def _event(data: str, reply: _Reply) -> None:
    if data.strip() == "[DONE]":
        reply.done = True
    elif not reply.done:  # after [DONE]: drained, so the connection is reused
        reply.take(json.loads(data), "delta")


def _ended(reads: Iterator[Iterator[str]], parser: SSEParser) -> Iterator[Iterator[str]]:
    yield from reads
    yield parser.close()


def _read_body(chunks: Iterator[bytes], reply: _Reply) -> Failure | None:
    body = b"".join(chunks)
    try:
        reply.take(json.loads(body), "message")
    except ValueError as exc:
        return Failure(FailureKind.INVALID_RESPONSE, f"the body is not a completion: {exc}")
    reply.done = True
    return _outcome(reply)
