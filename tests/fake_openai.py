"""A fake OpenAI-compatible (and Azure OpenAI) server for the backend tests: a real HTTP/1.1
server on 127.0.0.1, on a free port, in a thread of the test process.

It speaks the protocol over a real socket — JSON bodies, chunked server-sent events,
keep-alive — and misbehaves on request. The behaviour is the request's model name (the
deployment, for Azure paths); ``ok`` is the default:

=================  ==============================================================
``ok``             a completion (``stream: true``: SSE chunks, usage in the last)
``odd-sse``        SSE with events split across TCP writes, several events in one
                   write, comments and keep-alives, ``\\r\\n`` line endings
``no-usage``       a completion without ``usage`` (plain or streamed)
``rate-limit``     429 with ``Retry-After: 7``; ``rate-limit-date``: an HTTP date
                   30 s ahead; ``rate-limit-ms``: ``retry-after-ms: 1500``
``500``, ``503``   that status with an OpenAI error body
``reset``          headers and part of the body, then a TCP reset
``stall``          a few chunks (or, plain, the headers only), then nothing until the
                   client closes the connection (recorded)
``hang``           nothing at all — no headers — until the client closes (recorded)
``bad-json``       200 with a body (or, streamed, an event) that is not JSON
``filtered``       ``finish_reason: content_filter``
``filtered-400``   Azure's 400 with error code ``content_filter``
``echo-auth``      401 whose message echoes the request's credentials (redaction)
=================  ==============================================================

Every request is recorded (:class:`Record`): path, query, headers, body, and whether
the client closed the connection while the server was stalling.
"""

from __future__ import annotations

import email.utils
import json
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ANSWER = "Hello from the fake model, a reply of some words."
WAIT_CAP_S = 20.0  # a stalling handler gives up after this (a failing test, no hang)
WORDS = ANSWER.split(" ")


@dataclass
class Record:
    behaviour: str
    path: str
    query: str
    headers: dict[str, str]
    body: dict[str, Any]
    peer: int  # the client's port: one per connection
    stalling: threading.Event = field(default_factory=threading.Event)  # all written
    client_closed: threading.Event = field(default_factory=threading.Event)


def completion(model: str, text: str, finish: str = "stop", usage: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
        ],
    }
    if usage:
        out["usage"] = {"prompt_tokens": 11, "completion_tokens": 9, "total_tokens": 20}
    return out


def chunk(model: str, content: str | None, finish: str | None = None) -> dict[str, Any]:
    delta = {} if content is None else {"content": content}
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def usage_chunk(model: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "model": model,
        "choices": [],
        "usage": {"prompt_tokens": 11, "completion_tokens": 9, "total_tokens": 20},
    }


def event(obj: Any) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet

    def do_POST(self) -> None:
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        raw = self.rfile.read(int(self.headers.get("content-length", "0")))
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
        path, _, query = self.path.partition("?")
        behaviour = str(body.get("model") or _deployment(path) or "ok")
        headers = {k.lower(): v for k, v in self.headers.items()}
        rec = Record(behaviour, path, query, headers, body, self.client_address[1])
        self.server.add(rec)
        stream = bool(body.get("stream"))
        action = BEHAVIOURS.get(behaviour.split(":", maxsplit=1)[0], Handler.ok)
        action(self, rec, stream)

    # -- responses --------------------------------------------------------------------
    def send_json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        payload = json.dumps(obj).encode()
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def start_sse(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

    def write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        time.sleep(0.002)  # separate TCP segments (TCP_NODELAY): odd chunking for real

    def end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")

    def wait_closed(self, rec: Record) -> None:
        """Send nothing until the client closes the connection; record that it did."""
        sock, end = self.connection, time.monotonic() + WAIT_CAP_S
        self.close_connection = True
        rec.stalling.set()
        while time.monotonic() < end and not self.server.stopping.is_set():
            ready, _, _ = select.select([sock], [], [], 0.01)
            if not ready:
                continue
            try:
                data = sock.recv(1, socket.MSG_PEEK)
            except OSError:
                data = b""
            if not data:
                rec.client_closed.set()
                return

    # -- behaviours -------------------------------------------------------------------
    def ok(self, rec: Record, stream: bool, usage: bool = True) -> None:
        model = rec.behaviour
        if not stream:
            self.send_json(200, completion(model, ANSWER, usage=usage))
            return
        self.start_sse()
        for i, word in enumerate(WORDS):
            self.write_chunk(event(chunk(model, word if i == 0 else " " + word)))
        self.write_chunk(event(chunk(model, None, "stop")))
        if usage:
            self.write_chunk(event(usage_chunk(model)))
        self.write_chunk(b"data: [DONE]\n\n")
        self.end_chunks()

    def no_usage(self, rec: Record, stream: bool) -> None:
        self.ok(rec, stream, usage=False)

    def odd_sse(self, rec: Record, stream: bool) -> None:
        model = rec.behaviour
        if not stream:
            self.ok(rec, stream)
            return
        self.start_sse()
        first = event(chunk(model, WORDS[0])).replace(b"\n", b"\r\n")
        for piece in (first[:7], first[7:19], first[19:-1], first[-1:]):  # \r | \n split too
            self.write_chunk(piece)
        self.write_chunk(b": keep-alive\r\n\r\n")
        rest = b"".join(event(chunk(model, " " + w)) for w in WORDS[1:])
        self.write_chunk(b": ping\n\n" + rest)  # a comment and many events in one write
        tail = event(chunk(model, None, "stop")) + event(usage_chunk(model)) + b"data: [DONE]"
        self.write_chunk(tail[:5])
        self.write_chunk(tail[5:] + b"\n\n")
        self.end_chunks()

    def rate_limit(self, rec: Record, stream: bool) -> None:
        kind = rec.behaviour
        if kind == "rate-limit-date":
            headers = {"retry-after": email.utils.formatdate(time.time() + 30, usegmt=True)}
        elif kind == "rate-limit-ms":
            headers = {"retry-after-ms": "1500"}
        else:
            headers = {"retry-after": "7"}
        err = {"error": {"message": "Rate limit reached", "type": "requests", "code": "429"}}
        self.send_json(429, err, headers)

    def status(self, rec: Record, stream: bool) -> None:
        code = int(rec.behaviour)
        err = {"error": {"message": f"fake failure {code}", "type": "server_error"}}
        self.send_json(code, err)

    def reset(self, rec: Record, stream: bool) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", "4000")
        self.end_headers()
        self.wfile.write(b'{"id": "chatcmpl-fake", "choices": [')
        time.sleep(0.01)
        linger = struct.pack("ii", 1, 0)  # close with RST, not FIN
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
        self.close_connection = True
        self.connection.close()

    def stall(self, rec: Record, stream: bool) -> None:
        if stream:
            self.start_sse()
            for word in WORDS[:3]:
                self.write_chunk(event(chunk(rec.behaviour, word + " ")))
        else:
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", "4000")
            self.end_headers()
        self.wait_closed(rec)

    def hang(self, rec: Record, stream: bool) -> None:
        self.wait_closed(rec)

    def bad_json(self, rec: Record, stream: bool) -> None:
        if stream:
            self.start_sse()
            self.write_chunk(event(chunk(rec.behaviour, "fine ")))
            self.write_chunk(b'data: {"choices": [ not json\n\n')
            self.end_chunks()
            return
        payload = b'{"choices": [ this is not json'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def filtered(self, rec: Record, stream: bool) -> None:
        if not stream:
            self.send_json(200, completion(rec.behaviour, "", finish="content_filter"))
            return
        self.start_sse()
        self.write_chunk(event(chunk(rec.behaviour, "partial ")))
        self.write_chunk(event(chunk(rec.behaviour, None, "content_filter")))
        self.write_chunk(b"data: [DONE]\n\n")
        self.end_chunks()

    def filtered_400(self, rec: Record, stream: bool) -> None:
        err = {
            "error": {
                "message": "The response was filtered due to the prompt triggering a policy.",
                "type": None,
                "param": "prompt",
                "code": "content_filter",
                "status": 400,
                "innererror": {"code": "ResponsibleAIPolicyViolation"},
            }
        }
        self.send_json(400, err)

    def echo_auth(self, rec: Record, stream: bool) -> None:
        said = rec.headers.get("authorization") or rec.headers.get("api-key") or ""
        err = {"error": {"message": f"Incorrect API key provided: {said}", "code": "401"}}
        self.send_json(401, err)


BEHAVIOURS = {
    "ok": Handler.ok,
    "odd-sse": Handler.odd_sse,
    "no-usage": Handler.no_usage,
    "rate-limit": Handler.rate_limit,
    "rate-limit-date": Handler.rate_limit,
    "rate-limit-ms": Handler.rate_limit,
    "500": Handler.status,
    "503": Handler.status,
    "reset": Handler.reset,
    "stall": Handler.stall,
    "hang": Handler.hang,
    "bad-json": Handler.bad_json,
    "filtered": Handler.filtered,
    "filtered-400": Handler.filtered_400,
    "echo-auth": Handler.echo_auth,
}


def _deployment(path: str) -> str | None:
    parts = path.split("/")
    if "deployments" in parts and parts.index("deployments") + 1 < len(parts):
        return parts[parts.index("deployments") + 1]
    return None


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.records: list[Record] = []
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self.serve_forever, name="fake-openai")

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def add(self, rec: Record) -> None:
        with self._lock:
            self.records.append(rec)

    def of(self, behaviour: str) -> list[Record]:
        with self._lock:
            return [r for r in self.records if r.behaviour == behaviour]

    def start(self) -> FakeServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=5.0)
