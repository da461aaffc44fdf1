"""The OpenAI-protocol backend of bench/api_load.py, in the bench's own process: an async
Starlette app on uvicorn whose model ``fast`` answers at once and ``slow`` after
``hold_s``, streamed (``stream: true``) or not, counting its calls and its peak in-flight
calls."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from bench.api import ThreadedUvicorn, free_port

WORDS = ["The", "quick", "brown", "fox", "jumps"]
USAGE = {"prompt_tokens": 11, "completion_tokens": len(WORDS), "total_tokens": 16}
START_TIMEOUT_S = 30.0  # for a server (the backend, `haco serve`) to answer once started


def chunk(model: str, delta: dict[str, Any], usage: bool = False) -> bytes:
    obj: dict[str, Any] = {"id": "chatcmpl-bench", "object": "chat.completion.chunk"}
    obj["model"] = model
    obj["choices"] = [] if usage else [{"index": 0, "delta": delta, "finish_reason": None}]
    if usage:
        obj["usage"] = USAGE
    return f"data: {json.dumps(obj)}\n\n".encode()


class Backend(ThreadedUvicorn):
    """The OpenAI-protocol backend: ``fast`` at once, ``slow`` after ``hold_s``."""

    name = "the backend"

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self.inflight = 0
        self.peak = 0
        self.calls = 0
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        app = Starlette(routes=[Route("/v1/chat/completions", self.complete, methods=["POST"])])
        config = uvicorn.Config(
            app,
            port=port,
            log_level="warning",
            ws="none",
            backlog=4096,
            lifespan="off",
            timeout_keep_alive=300,
        )
        super().__init__(config, START_TIMEOUT_S, daemon=True)

    async def complete(self, request: Request) -> Response:
        body = await request.json()
        model = str(body.get("model", "fast"))
        self.calls += 1
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)
        try:
            if model == "slow":
                await asyncio.sleep(self.hold_s)
        finally:
            self.inflight -= 1
        if not body.get("stream"):
            msg = {"role": "assistant", "content": " ".join(WORDS)}
            return JSONResponse(
                {
                    "id": "chatcmpl-bench",
                    "object": "chat.completion",
                    "model": model,
                    "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
                    "usage": USAGE,
                }
            )

        async def events() -> AsyncIterator[bytes]:
            for i, word in enumerate(WORDS):
                yield chunk(model, {"content": word if i == 0 else " " + word})
            yield chunk(model, {})
            yield chunk(model, {}, usage=True)
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")
