"""``stream: true`` on POST /v1/chat/completions: a relayed stream
(coordinator.runtime.streaming). The first member to produce a token wins; its deltas go
out as ``chat.completion.chunk`` events exactly as they arrived, then a ``stop`` chunk, the
usage chunk and ``data: [DONE]``. Headers name the invocation, the winner candidate and
its zone; ``x-haco-stream`` says ``relayed`` or, under a winner rule other than ``first``,
``buffered`` (the finished winner's text re-chunked, as before). A winner that fails
mid-stream ends it with an ``error`` event (the openai SDK raises it), then ``[DONE]``."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request, Response
from fastapi.responses import StreamingResponse

from coordinator.api.convert import chunks, headers, to_messages
from coordinator.api.deps import client_of, metrics_of
from coordinator.api.metrics import ApiMetrics
from coordinator.errors import HedgeError
from coordinator.runtime.results import InvocationResult
from coordinator.runtime.streaming import Buffered, StreamEnd, StreamEvent, StreamStart
from schemas.openai_api import ChatCompletionRequest

SSE = "text/event-stream"


async def relay(request: Request, body: ChatCompletionRequest, options: dict[str, Any]) -> Response:
    events = client_of(request).astream(body.model, to_messages(body.messages), **options)
    try:
        first = await anext(events)
    except HedgeError as exc:
        metrics_of(request).observe_error(body.model, exc)
        raise
    created = int(time.time())
    if isinstance(first, Buffered):
        metrics_of(request).observe(first.result)
        why = "buffered; the winner rule is not first"
        hdrs = {**headers(first.result), "x-haco-stream": why}
        return StreamingResponse(
            chunks(first.result, body.model, created), media_type=SSE, headers=hdrs
        )
    if not isinstance(first, StreamStart):  # pragma: no cover - astream starts so
        raise TypeError(f"a relay starts with StreamStart, not {type(first).__name__}")
    hdrs = {
        "x-haco-invocation-id": first.group_id,
        "x-haco-candidate": first.candidate_id,
        "x-haco-zone": first.zone,
        "x-haco-stream": "relayed; first token",
    }
    sse = _sse(events, _Out(body.model, created, first, metrics_of(request)))
    return StreamingResponse(sse, media_type=SSE, headers=hdrs)


@dataclass(frozen=True, slots=True)
class _Out:
    model: str
    created: int
    start: StreamStart
    metrics: ApiMetrics

    def observe(self, end: StreamEnd) -> None:
        """The relayed invocation counted like any other, once its group closed."""
        if isinstance(end.outcome, InvocationResult):
            self.metrics.observe(end.outcome)
        elif isinstance(end.outcome, HedgeError):
            self.metrics.observe_error(self.model, end.outcome)


async def _sse(events: AsyncIterator[StreamEvent], out: _Out) -> AsyncIterator[str]:
    base = {
        "id": f"chatcmpl-{out.start.group_id}",
        "object": "chat.completion.chunk",
        "created": out.created,
        "model": out.model,
    }

    def event(delta: dict[str, str], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return f"data: {json.dumps({**base, 'choices': [choice]})}\n\n"

    yield event({"role": "assistant", "content": ""})
    async with contextlib.aclosing(events):  # type: ignore[type-var]
        async for ev in events:
            if isinstance(ev, str):
                yield event({"content": ev})
            elif isinstance(ev, StreamEnd):
                out.observe(ev)
                yield _last(ev, base, event)
    yield "data: [DONE]\n\n"


def _last(end: StreamEnd, base: dict[str, Any], event: Any) -> str:
    if not end.ok:
        error = {"message": end.reason, "type": "upstream_error", "code": "winner_failed"}
        return f"data: {json.dumps({'error': error})}\n\n"
    usage = {
        "prompt_tokens": end.tokens_in,
        "completion_tokens": end.tokens_out,
        "total_tokens": end.tokens_in + end.tokens_out,
    }
    stop: str = event({}, "stop")
    return stop + f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n"
