"""`haco demo --local-model`: real hedged invocations against a real model on this machine.

Starts llama.cpp's OpenAI-compatible server (SmolLM2-135M on the CPU,
:mod:`coordinator.services.llama`) once per candidate, in three zones: ``local`` (plain,
streamed), ``regional`` (unreliable: ``real_failure_rate``, an injected outage before the
request is sent) and ``global`` (slow: a delay proxy in front of its server, a far link the
RTT probe sees too), plus a fourth server as the judge's evaluator (a JSON-schema
``response_format``, so a 135M model's score parses). Then the services of `haco up`
(Redis and Postgres, embedded when ``HACO_*_URL`` are unset, the harvester, beat), a worker
per zone and the judge worker; N real invocations through :class:`HacoClient`; a bounded
wait for the judge; and a summary: every invocation, the totals, and the profiles after,
α/β carrying the LLM-as-judge scores. The summary is also printed as JSON on stdout.
With ``HACO_REDIS_URL`` / ``HACO_DATABASE_URL`` set, the demo's candidates (``smol-*``)
and their traces go to those servers and add up across runs.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from coordinator.config import HacoSettings
from coordinator.core.evidence import link_id
from coordinator.errors import HedgeError, InputError, ServiceError
from coordinator.runtime.client import HacoClient
from coordinator.runtime.coordinator import InvocationResult
from coordinator.runtime.dispatch import answering, worker_node
from coordinator.runtime.profile_view import profile_rows
from coordinator.services import llama
from coordinator.services.supervisor import Stack, start_stack
from coordinator.state.epochs import ProfileView
from coordinator.state.keys import JUDGE_QUEUE
from schemas.enums import MemberStatus

PROMPTS = (
    "What is 2 + 2? Answer in one sentence.",
    "Name three primary colours.",
    "Say hello in five words.",
    "What is the capital of France?",
    "Give one tip for writing clear code.",
)
# A 135M model does not keep to "Score: N/10" on its own; llama.cpp's server turns this
# JSON schema into a grammar, so the judge's answer parses (tests/test_real_model.py).
SCORE_FORMAT = {
    "type": "json_object",
    "schema": {
        "type": "object",
        "properties": {"score": {"type": "integer", "minimum": 0, "maximum": 10}},
        "required": ["score"],
    },
}
JUDGE_PROMPT = (
    "You are a strict evaluator. Rate how well the RESPONSE answers the REQUEST from 0 "
    "to 10.\n\nREQUEST:\n{request}\n\nRESPONSE:\n{output}\n\n"
    'Reply with a JSON object {"score": <integer 0-10>}.'
)
ZONES = ("local", "regional", "global")
JUDGE_OUTCOMES = ("judge_applied", "judge_unscored", "judge_duplicate")


@dataclass(frozen=True)
class LocalDemoSettings:
    """The demo's world: how unreliable, how slow, how long to wait."""

    failure_rate: float = 0.3  # regional: share of calls failing before the request
    global_delay_s: float = 1.5  # global: the proxy's wait per request
    max_tokens: int = 48
    judge_max_tokens: int = 16
    read_timeout_s: float = 120.0
    deadline_s: float = 180.0
    workers_ready_s: float = 90.0
    judge_wait_s: float = 240.0
    poll_s: float = 0.5
    # A CPU model's first call warms it up: far beyond the runtime's default patience
    # (a started member silent this long stops holding back the ranked rule).
    patience_min_s: float = 60.0
    llama: llama.LlamaSettings = field(default_factory=llama.LlamaSettings)


def _toml(value: object) -> str:
    """A TOML value (inline tables and arrays; strings as JSON, which TOML reads)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))


def _table_toml(header: str, body: dict[str, object]) -> str:
    return f"\n{header}\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in body.items())


def _candidate(cid: str, role: str, zone: str, settings: dict[str, object]) -> dict[str, object]:
    return {"id": cid, "role": role, "model": llama.MODEL_ALIAS, "zone": zone,
            "backend": {"kind": "openai", "settings": settings}}  # fmt: skip


def pool_text(urls: dict[str, str], judge_url: str, s: LocalDemoSettings) -> str:
    """The pool config of the demo: three coder candidates, one per zone, and the judge."""

    def backend(url: str, stream: bool, **extra: object) -> dict[str, object]:
        return {"base_url": f"{url}/v1", "model": llama.MODEL_ALIAS, "stream": stream,
                "max_tokens": s.max_tokens, "temperature": 0.0,
                "read_timeout_s": s.read_timeout_s, **extra}  # fmt: skip

    cands = [
        _candidate("smol-local", "coder", "local", backend(urls["local"], True)),
        {
            **_candidate("smol-regional", "coder", "regional", backend(urls["regional"], False)),
            "real_failure_rate": s.failure_rate,
        },
        _candidate("smol-global", "coder", "global", backend(urls["global"], False)),
    ]
    judge = _candidate("smol-judge", "judge", "local", backend(
        judge_url, False, max_tokens=s.judge_max_tokens,
        extra_body={"response_format": SCORE_FORMAT},
    ))  # fmt: skip
    text = f'caller_zone = "local"\nzones = {_toml(list(ZONES))}\n'
    text += _table_toml("[defaults]", {"deadline_s": s.deadline_s})
    text += "".join(_table_toml("[[candidates]]", c) for c in cands)
    text += _table_toml("[[evaluators]]", judge)
    text += _table_toml(
        "[evaluator]", {"scorer": "llm", "candidate": "smol-judge", "prompt": JUDGE_PROMPT}
    )
    return text


@dataclass
class Row:
    """One invocation, as the summary shows it."""

    task: int
    prompt: str
    winner: str | None
    zone: str | None
    members: list[str]
    launched: int
    latency_s: float
    failures: list[str]
    output: str | None = None
    error: str | None = None


def _failure_kind(reason: str | None) -> str:
    return (reason or "unknown").split(":")[0].split("(")[0].strip()[:40]


def _row(task: int, prompt: str, res: InvocationResult) -> Row:
    return Row(
        task=task, prompt=prompt, winner=res.candidate_id, zone=res.zone,
        members=[f"{m.candidate_id}:{m.status.value}" for m in res.members],
        launched=sum(1 for m in res.members if m.launched), latency_s=res.latency_s,
        failures=[f"{m.candidate_id}: {_failure_kind(m.reason)}" for m in res.members
                  if m.status is not MemberStatus.SUCCEEDED and m.reason],
        output=(res.output or "").strip()[:60],
    )  # fmt: skip


def run_invocations(client: HacoClient, tasks: int, deadline_s: float) -> list[Row]:
    rows = []
    for i in range(tasks):
        prompt = PROMPTS[i % len(PROMPTS)]
        t0 = time.monotonic()
        try:
            rows.append(_row(i + 1, prompt, client.invoke("coder", prompt, deadline_s=deadline_s)))
        except HedgeError as exc:
            failures = getattr(exc, "failures", {})
            rows.append(Row(i + 1, prompt, None, None, list(failures), len(failures),
                            time.monotonic() - t0, [_failure_kind(r) for r in failures.values()],
                            error=type(exc).__name__))  # fmt: skip
    return rows


def _wait(
    ready: Callable[[], bool],
    timeout_s: float,
    poll_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] = time.sleep,
) -> bool:
    """Whether ``ready`` came true within ``timeout_s`` (clock and sleep injectable)."""
    deadline = clock() + timeout_s
    while not ready():
        if clock() > deadline:
            return False
        sleep(poll_s)
    return True


def wait_for_workers(client: HacoClient, s: LocalDemoSettings) -> None:
    host = socket.gethostname()
    names = [worker_node(z, host) for z in ZONES] + [worker_node("judge", host)]

    def answered() -> bool:
        return answering(client.app, names) >= set(names)

    if not _wait(answered, s.workers_ready_s, s.poll_s):
        raise ServiceError(
            f"the workers {names} did not answer a ping within {s.workers_ready_s}s "
            f"(queues haco.zone.* and {JUDGE_QUEUE}); see their logs under the state dir"
        )


def judged_count(client: HacoClient) -> int:
    metrics = client.store.metrics()
    return sum(metrics.get(k, 0) for k in JUDGE_OUTCOMES)


def _view(client: HacoClient) -> ProfileView:
    cands = client.pool.candidates("coder")
    caller = client.pool.config.caller_zone
    return client.store.load_view([c.id for c in cands], [link_id(caller, c.zone) for c in cands])


def wait_for_judge(client: HacoClient, launched: int, s: LocalDemoSettings) -> tuple[int, float]:
    """Bounded by ``judge_wait_s``: until every launched member has reported (the losers
    run on after the winner) and each success of theirs is judged; (judgements, waited)."""
    t0 = time.monotonic()

    def done() -> bool:
        profiles = _view(client).candidates.values()
        if sum(p.calls for p in profiles) < launched:
            return False
        return judged_count(client) >= sum(p.successes for p in profiles)

    _wait(done, s.judge_wait_s, s.poll_s)
    return judged_count(client), time.monotonic() - t0


def profiles_after(client: HacoClient) -> list[dict[str, Any]]:
    view, caller = _view(client), client.pool.config.caller_zone
    rows = profile_rows(client.pool.candidates("coder"), caller, view)
    for row in rows:
        p = view.candidates.get(row["candidate"])
        link = view.links.get(link_id(caller, row["zone"]))
        row["link_rtt_s"] = link.rtt.mean if link else None
        row["alpha"], row["beta"] = (p.alpha, p.beta) if p else (1.0, 1.0)
        row["judged"] = round(row["alpha"] + row["beta"] - 2.0, 6)  # prior Beta(1, 1)
    return rows


def _invocation_table(rows: list[Row]) -> Table:
    t = Table(title="real hedged invocations (SmolLM2-135M, llama.cpp, this CPU)")
    for col in ("#", "winner", "zone", "members", "latency s", "failures", "output"):
        t.add_column(col)
    for r in rows:
        t.add_row(str(r.task), r.winner or f"— {r.error}", r.zone or "—", " ".join(r.members),
                  f"{r.latency_s:.2f}", "; ".join(r.failures) or "—", r.output or "")  # fmt: skip
    return t


def _num(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def _profile_table(profiles: list[dict[str, Any]], judged: int, waited: float) -> Table:
    t = Table(title=f"profiles after ({judged} judgements, waited {waited:.1f}s for the judge)")
    for col in ("candidate", "zone", "α", "β", "μ", "calls", "f_int", "p50 s", "link RTT s"):
        t.add_column(col, justify="right")
    for p in profiles:
        p50, rtt = p["latency_p50_s"], p["link_rtt_s"]
        t.add_row(p["candidate"], p["zone"], f"{p['alpha']:.2f}", f"{p['beta']:.2f}",
                  f"{p['mu']:.3f}", f"{p['calls']:.0f}", f"{p['fail_internal']:.2f}",
                  _num(p50), _num(rtt))  # fmt: skip
    return t


def summarize(rows: list[Row]) -> dict[str, Any]:
    kinds = Counter(f.split(": ", 1)[-1] for r in rows for f in r.failures)
    return {
        "tasks": len(rows),
        "won": sum(1 for r in rows if r.winner),
        "hedge_sizes": dict(Counter(str(r.launched) for r in rows)),
        "winner_zones": dict(Counter(r.zone or "none" for r in rows)),
        "failure_kinds": dict(kinds),
        "mean_latency_s": sum(r.latency_s for r in rows) / max(1, len(rows)),
    }


@contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    """The workers inherit this process's environment (Stack.env)."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _servers(
    python: str, gguf: Path, state: Path, s: LocalDemoSettings, stack: ExitStack
) -> tuple[dict[str, str], str]:
    """The llama.cpp servers (three candidates, one judge) and the global zone's proxy."""
    logs = [state / "logs" / f"llama-{n}.log" for n in (*ZONES, "judge")]
    servers = llama.start_llama_servers(python, gguf, logs, s.llama)
    for srv in servers:
        stack.callback(srv.stop, s.llama.stop_timeout_s)
    proxy = llama.DelayProxy(servers[2].url, s.global_delay_s).start()
    stack.callback(proxy.stop)
    urls = {"local": servers[0].url, "regional": servers[1].url, "global": proxy.url}
    return urls, servers[3].url


def _drive(
    stack: Stack, settings: HacoSettings, tasks: int, s: LocalDemoSettings
) -> dict[str, Any]:
    with HacoClient(settings, redis_url=stack.redis_url) as client:
        wait_for_workers(client, s)
        rows = run_invocations(client, tasks, s.deadline_s)
        judged, waited = wait_for_judge(client, sum(r.launched for r in rows), s)
        profiles = profiles_after(client)
    return {"invocations": [asdict(r) for r in rows], "totals": summarize(rows),
            "judgements": judged, "judge_wait_s": waited, "profiles": profiles}  # fmt: skip


def run_local_demo(
    tasks: int, console: Console, s: LocalDemoSettings | None = None
) -> dict[str, Any]:
    """The whole demo; returns (and prints) its summary."""
    s = s or LocalDemoSettings()
    if tasks < 1:
        raise InputError(f"--tasks={tasks}; expected at least 1")
    python = llama.llm_python()
    gguf = llama.local_model_file(python)  # fail first, before any service starts
    with tempfile.TemporaryDirectory(prefix="haco-local-") as tmp, ExitStack() as cleanup:
        state = Path(tmp)
        console.print(f"starting 4 llama.cpp servers (SmolLM2-135M) under {state} …")
        urls, judge_url = _servers(python, gguf, state, s, cleanup)
        pool = state / "pool.toml"
        pool.write_text(pool_text(urls, judge_url, s), encoding="utf-8")
        cleanup.enter_context(_env("HACO_POOL_FILE", str(pool)))
        settings = HacoSettings(state_dir=state, pool_file=pool, patience_min_s=s.patience_min_s)
        console.print("starting Redis, Postgres, the harvester, beat and 4 workers …")
        stack = start_stack(settings, list(ZONES), with_store=True)
        cleanup.callback(stack.stop)
        stack.start_judge()
        summary = _drive(stack, settings, tasks, s)
    console.print(_invocation_table_from(summary))
    console.print(
        _profile_table(summary["profiles"], summary["judgements"], summary["judge_wait_s"])
    )
    console.print(f"totals: {json.dumps(summary['totals'])}")
    print(json.dumps(summary, indent=2, default=str))
    return summary


def _invocation_table_from(summary: dict[str, Any]) -> Table:
    return _invocation_table([Row(**r) for r in summary["invocations"]])
