"""The service's gate, as pure ASGI middleware: bearer-token auth for everything under
/v1 (HACO_API_TOKENS; open when unset) and the request-size limit (HACO_API_MAX_BODY_BYTES,
413 beyond: by Content-Length before reading, else while the body streams in)."""

from __future__ import annotations

import hmac
import json
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coordinator.config import HacoSettings


def parse_tokens(raw: str | None) -> list[str]:
    """HACO_API_TOKENS: comma-separated; blanks ignored."""
    return [t.strip() for t in (raw or "").split(",") if t.strip()]


def _error(status: int, message: str, kind: str, code: str) -> tuple[bytes, list[Any]]:
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    return data, headers


async def _answer(send: Send, status: int, message: str, kind: str, code: str) -> None:
    data, headers = _error(status, message, kind, code)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


class Guard:
    def __init__(self, app: ASGIApp, settings: HacoSettings) -> None:
        self.app = app
        self.tokens = [t.encode() for t in parse_tokens(settings.api_tokens)]
        self.limit = settings.api_max_body_bytes

    def _authorized(self, scope: Scope) -> bool:
        if not self.tokens or not str(scope.get("path", "")).startswith("/v1"):
            return True
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"authorization", b"")
        scheme, _, token = given.partition(b" ")
        if scheme.lower() != b"bearer" or not token:
            return False
        return any(hmac.compare_digest(token.strip(), t) for t in self.tokens)

    def _declared(self, scope: Scope) -> int | None:
        raw = dict(scope.get("headers") or []).get(b"content-length")
        try:
            return int(raw) if raw is not None else None
        except ValueError:
            return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self._authorized(scope):
            await _answer(
                send, 401, "missing or invalid bearer token (Authorization: Bearer <token>)",
                "authentication_error", "invalid_api_key",
            )  # fmt: skip
            return
        declared = self._declared(scope)
        too_large = f"request body exceeds the limit of {self.limit} bytes"
        if declared is not None and declared > self.limit:
            await _answer(send, 413, too_large, "invalid_request_error", "request_too_large")
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise HTTPException(413, too_large)
            return message

        await self.app(scope, limited, send)
