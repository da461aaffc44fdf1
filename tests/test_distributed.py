"""The distributed runtime end to end: real Redis, real Celery worker processes, no mocks.

Every test runs three times: against a Redis given by URL, as HACO_REDIS_URL gives one (the
run's own server, tests/services.py: DB 0 for HACO's keys and DB 1 for Celery's broker,
flushed at start; never the machine's, whose DB 0 and 1 belong to whoever runs `haco up`
there), against an embedded valkey-server started by ``start_stack`` as ``haco up``
does, and against the first with workers that run members through Celery's consumer
(``HACO_MEMBER_LANE=false``) instead of the member lane (workers/lane.py). Workers start
once per server (one per zone; the
``solo`` zone has a single thread so its queue can be kept busy).

Members are deterministic: the scenario written below gives every model a fixed latency
(lognormal sigma 0) and every candidate a failure rate of 0 or 1, on lossless links.
Each test uses its own role and starts from cold profiles, where every candidate has the
same U⁺ and the rank order is the pool order (``ROLES`` below).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from polling import wait_for
from services import UNREACHABLE_REDIS_URL, flush_runtime_dbs, wait_ready

from coordinator.config import HacoSettings
from coordinator.errors import AllFailedError, ConfigError, DeadlineError
from coordinator.runtime import liveness
from coordinator.runtime.client import HacoClient
from coordinator.runtime.dispatch import await_answers, worker_node
from coordinator.runtime.pool import load_pool
from coordinator.runtime.results import InvocationResult
from coordinator.runtime.zone_view import inspect_workers
from coordinator.services.supervisor import Stack, start_stack
from coordinator.state import keys
from coordinator.state.broker import with_db
from coordinator.state.budget import RedisBudget
from schemas.enums import FailureKind, GroupState, MemberStatus
from schemas.models import GroupVerdict, MemberReport, MemberTrace

HACO = str(Path(sys.executable).with_name("haco"))
SCALE = 0.02  # simulated seconds x SCALE = wall-clock seconds
MODELS = {"fast": 0.05, "medium": 0.3, "long": 1.2, "slow": 2.0}  # wall-clock seconds
MODELS |= {"fast-good": 0.05, "fast-fair": 0.05}  # judged nearly without noise:
QUALITY = {"fast-good": (0.85, 1000), "fast-fair": (0.6, 1000)}  # (mean, concentration)
MAIN_ZONES = ("local", "regional", "global")
SOLO = "solo"  # served by one single-threaded worker
ZONES = (*MAIN_ZONES, SOLO)
# role -> (model, zone, failure rate) per candidate, in rank order on a cold pool
ROLES: dict[str, list[tuple[str, str, int]]] = {
    "basic": [("fast", "global", 1), ("medium", "regional", 0), ("fast", "local", 0)],
    "queued": [("medium", "local", 0)] + [("slow", SOLO, 0)] * 3,
    "cancel": [("medium", "local", 0), ("slow", "regional", 0)],
    "late": [("slow", "regional", 0), ("slow", "global", 0)],
    "broken": [("fast", z, 1) for z in MAIN_ZONES],
    "effect": [("fast", z, 0) for z in MAIN_ZONES],
    "budget": [("medium", z, 0) for z in MAIN_ZONES],
    "doomed": [("long", "regional", 0), ("fast", "local", 0)],
    "dark": [("fast-good", "global", 0), ("fast-fair", "regional", 0), ("fast-fair", "local", 0)],
}
BURST = 3
BUDGET_SCRIPT = """
import json, sys
from coordinator.runtime.client import HacoClient
from coordinator.config import HacoSettings
url, pool = sys.argv[1:3]
settings = HacoSettings(redis_url=url, pool_file=pool, budget_burst=int(sys.argv[3]),
    budget_ratio=0.0, initial_hedge_delay_s=0.001, hedge_delay_min_samples=100_000)
with HacoClient(settings, redis_url=url) as client:
    print(json.dumps([client.invoke("budget", "hi", launch_mode="staggered", tau=0.95,
        deadline_s=10).backups for _ in range(2)]))
"""


def write_pool(folder: Path) -> Path:
    """The test scenario and a pool config that takes its whole pool."""
    zones = json.dumps(list(ZONES))
    lines = ['name = "distributed"', 'caller_zone = "local"', f"zones = {zones}"]
    lines += ["[network]", "timeout_s = 1.0"]
    for zone in ZONES:
        lines += ["[[links]]", 'a = "local"', f'b = "{zone}"', "latency_ms = 1", "jitter_ms = 0"]
        lines += ["bandwidth_tokens_per_ms = 1000", "loss = 0"]
    for name, seconds in MODELS.items():
        mean, conc = QUALITY.get(name, (0.6, 10))
        lines += [f'[models."{name}"]', f"quality = {{ mean = {mean}, concentration = {conc} }}"]
        lines += [f'latency = {{ kind = "lognormal", median_s = {seconds / SCALE}, sigma = 0 }}']
        lines += ["tokens_out = { median = 20, sigma = 0 }"]
    lines += ["[evaluator]", 'model = "fast"', 'zone = "local"']
    for role, members in ROLES.items():
        for i, (model, zone, failure) in enumerate(members):
            lines += ["[[candidates]]", f'id = "{role}-{i}"', f'role = "{role}"']
            lines += [f'model = "{model}"', f'zone = "{zone}"', f"failure_rate = {failure}"]
    (folder / "scenario.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    pool = folder / "pool.toml"
    pool.write_text(
        f'caller_zone = "local"\nzones = {zones}\n\n[sim]\n'
        f'scenario = "scenario.toml"\ntime_scale = {SCALE}\n',
        encoding="utf-8",
    )
    return pool


def reports(r: redis.Redis, group_id: str, source: str) -> dict[str, MemberTrace]:
    """Member traces of a group, by member id, from its reply list (reports the
    coordinator did not consume) or from the trace stream (executed members only)."""
    if source == "replies":
        # Not the workers' start signals (coordinator.runtime.liveness), only reports.
        raw = [x for x in r.lrange(keys.group_replies(group_id), 0, -1) if x.startswith(b"{")]
    else:
        field = keys.REPORT_FIELD.encode()  # not the groups' verdicts
        raw = [fields[field] for _, fields in r.xrange(keys.TRACES) if field in fields]
    traces = [MemberReport.model_validate_json(x).trace for x in raw]
    return {t.member_id: t for t in traces if t.group_id == group_id}


def wait_reports(
    r: redis.Redis, group_id: str, members: set[str], source: str, timeout_s: float = 10.0
) -> dict[str, MemberTrace]:
    def complete() -> dict[str, MemberTrace] | None:
        got = reports(r, group_id, source)
        return got if members <= got.keys() else None

    return wait_for(f"{source} of {sorted(members)}", complete, timeout_s)


def finish(proc: subprocess.Popen[str], timeout_s: float) -> tuple[str, str]:
    """Wait for a subprocess (killing it after ``timeout_s``); its stdout and stderr."""
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"{proc.args} did not finish in {timeout_s} s: {err}") from None
    assert proc.returncode == 0, f"{proc.args} exited {proc.returncode}: {err}"
    return out, err


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HACO_")}
    return {**env, **extra}


@dataclass
class Services:
    url: str
    stack: Stack
    pool_file: Path
    client: HacoClient  # default settings: ranked winner, losers kept running

    @property
    def r(self) -> redis.Redis:
        return self.client.redis  # DB 0, HACO's keys

    def settings(self, **overrides: Any) -> HacoSettings:
        return HacoSettings(redis_url=self.url, pool_file=self.pool_file, **overrides)

    def restart_worker(self, zone: str) -> None:
        self.stack.start_worker(zone, 1 if zone == SOLO else 4)
        wait_ready(self.client, [zone])


@pytest.fixture(scope="module", params=["external", "embedded", "external-celery"])
def services(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Services]:
    """``external-celery``: the external server, workers running members through
    Celery's consumer instead of the member lane (workers/lane.py, the default)."""
    external = request.param.startswith("external")
    lane = not request.param.endswith("celery")
    url = request.getfixturevalue("runtime_redis_url") if external else ""
    tmp = tmp_path_factory.mktemp(request.param)
    pool_file = write_pool(tmp)
    with pytest.MonkeyPatch.context() as mp:
        for name in [n for n in os.environ if n.startswith("HACO_")]:
            mp.delenv(name)
        mp.setenv("HACO_POOL_FILE", str(pool_file))  # workers read it from the environment
        if not lane:
            mp.setenv("HACO_MEMBER_LANE", "false")
        if external:
            flush_runtime_dbs(url)
        # An empty URL makes start_stack start an embedded server, as `haco up` does.
        base = HacoSettings(redis_url=url, state_dir=tmp / "state")
        stack = start_stack(base, MAIN_ZONES, concurrency=4)
        try:
            stack.start_worker(SOLO, 1)
            settings = HacoSettings(redis_url=stack.redis_url, pool_file=pool_file)
            with HacoClient(settings, redis_url=stack.redis_url) as client:
                wait_ready(client, ZONES)
                # A lane worker's Celery consumer listens on the zone's lane queue.
                broker = redis.Redis.from_url(with_db(stack.redis_url, keys.BROKER_DB))
                with broker:
                    for zone in ZONES:
                        bound = broker.exists(f"_kombu.binding.{keys.lane_queue(zone)}")
                        assert bool(bound) is lane
                yield Services(stack.redis_url, stack, pool_file, client)
        finally:
            stack.stop()
            if external:
                flush_runtime_dbs(url)


@pytest.fixture
def svc(services: Services) -> Services:
    """The services with cold profiles, an empty hedge-delay window and a full budget."""
    r = services.r
    r.delete(*r.scan_iter("haco:prof:*"), *r.scan_iter("haco:delay:*"), keys.BUDGET)
    return services


def test_await_answers_names_the_workers_that_answer(svc: Services) -> None:
    host = socket.gethostname()
    live, absent = worker_node(SOLO, host), worker_node("nowhere", host)
    ticks = iter(range(1_000))  # a clock that moves one step per look: three pings at most
    seen = await_answers(svc.client.app, [live, absent], 3.0, lambda: float(next(ticks)))
    assert seen == {live}
    stop = threading.Event()
    stop.set()
    assert await_answers(svc.client.app, [live], math.inf, stop=stop) == set()


def test_invocation_returns_the_best_ranked_success(svc: Services) -> None:
    res = svc.client.invoke("basic", "hi", deadline_s=10)
    assert res.state is GroupState.WON
    assert [m.candidate_id for m in res.members] == ["basic-0", "basic-1", "basic-2"]
    ok, failed = MemberStatus.SUCCEEDED, MemberStatus.FAILED
    assert [m.status for m in res.members] == [failed, ok, ok]
    assert res.members[0].reason == "the service failed"
    best = min(m.rank for m in res.members if m.status is ok)
    assert res.winner_id == f"{res.group_id}.{best}" == f"{res.group_id}.1"
    assert (res.candidate_id, res.zone) == ("basic-1", "regional")
    assert res.output == "[medium@regional] basic output"
    # Rank 2 finished first: the ranked rule still picks rank 1.
    assert res.members[2].latency_s < res.members[1].latency_s
    assert 0.0 < res.p_success <= 1.0
    assert res.tokens > 0
    # The close appended the group's verdict to the trace stream, for invocations.
    field = keys.VERDICT_FIELD.encode()
    found = [GroupVerdict.model_validate_json(f[field]) for _, f in svc.r.xrange(keys.TRACES)
             if field in f]  # fmt: skip
    (v,) = [v for v in found if v.group_id == res.group_id]
    assert (v.state, v.winner_member, v.p_success) == (res.state, res.winner_id, res.p_success)
    assert (v.launched, v.failed) == (3, 1) and v.succeeded + v.running == 2


def test_unknown_zone_is_rejected(tmp_path: Path) -> None:
    bad = tmp_path / "pool.toml"
    bad.write_text(
        'caller_zone = "local"\nzones = ["local"]\n\n[[candidates]]\nid = "x-0"\n'
        'role = "x"\nmodel = "m"\nzone = "mars"\nbackend = { kind = "http" }\n',
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match="unknown zone 'mars'"):
        load_pool(bad)
    with pytest.raises(ConfigError, match="unknown zone 'mars'"):
        HacoClient(HacoSettings(pool_file=bad), redis_url=UNREACHABLE_REDIS_URL)
    argv, env = [HACO, "worker", "--zone", "nosuch"], clean_env()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "unknown zone 'nosuch'" in proc.stderr


def test_queued_members_cancelled_before_start_never_run(svc: Services) -> None:
    # Ranks 1-3 queue on the single-threaded solo worker: one runs, the others wait.
    with HacoClient(svc.settings(cancel_losers=True), redis_url=svc.url) as client:
        res = client.invoke("queued", "hi", deadline_s=10)
    assert res.winner_id == f"{res.group_id}.0"
    assert [m.status for m in res.members[1:]] == [MemberStatus.CANCELLED] * 3
    losers = {m.member_id for m in res.members[1:]}
    replies = wait_reports(svc.r, res.group_id, losers, "replies")
    assert {t.status for t in replies.values()} == {MemberStatus.CANCELLED}
    never = {mid for mid, t in replies.items() if t.failure_reason == "group cancelled"}
    assert len(never) >= 2, f"expected at least two members never started: {replies}"
    for mid in never:
        t = replies[mid]
        assert (t.tokens_in, t.tokens_out, t.proc_latency_s) == (0, 0, None)
        assert t.started_at_s == t.finished_at_s
    ran = losers - never  # the one that was running: cancelled, and traced
    traced = wait_reports(svc.r, res.group_id, ran, "traces")
    assert {traced[m].failure_reason for m in ran} <= {"cancelled while running"}
    assert not never & traced.keys(), "a member that never started left an execution trace"


def test_running_member_stops_within_the_polling_interval(svc: Services) -> None:
    with HacoClient(svc.settings(cancel_losers=True), redis_url=svc.url) as client:
        res = client.invoke("cancel", "hi", deadline_s=10)
        won_at = time.time()
    assert res.winner_id == f"{res.group_id}.0"
    assert res.members[1].status is MemberStatus.CANCELLED
    loser = res.members[1].member_id
    t = wait_reports(svc.r, res.group_id, {loser}, "replies", timeout_s=MODELS["slow"] + 2)[loser]
    assert t.status is MemberStatus.CANCELLED
    assert t.failure_reason == "cancelled while running"
    assert t.started_at_s < won_at, "the member should have been running at the verdict"
    assert t.finished_at_s - won_at < 0.5 * MODELS["slow"]
    assert t.finished_at_s - t.started_at_s < 0.5 * MODELS["slow"]


def test_deadline_is_honoured(svc: Services) -> None:
    deadline_s = 0.5
    with pytest.raises(DeadlineError) as info:
        svc.client.invoke("late", "hi", deadline_s=deadline_s)
    gid = info.value.group_id
    reason = f"no report within deadline_s={deadline_s}"
    assert info.value.failures == {f"{gid}.0": reason, f"{gid}.1": reason}
    # The group is cancelled at the deadline: the slow members stop rather than finish.
    late = wait_reports(svc.r, gid, set(info.value.failures), "replies", MODELS["slow"])
    assert {t.status for t in late.values()} == {MemberStatus.CANCELLED}


def test_all_failed_error_lists_every_reason(svc: Services) -> None:
    with pytest.raises(AllFailedError) as info:
        svc.client.invoke("broken", "hi", deadline_s=10)
    gid = info.value.group_id
    assert info.value.failures == {f"{gid}.{r}": "the service failed" for r in range(3)}


def test_idempotency_key_gives_exactly_one_side_effect(svc: Services) -> None:
    key = f"effect-{uuid.uuid4().hex}"
    res = svc.client.invoke("effect", "hi", deadline_s=10, idempotency_key=key)
    members = {m.member_id for m in res.members}
    assert len(members) == 3
    traced = wait_reports(svc.r, res.group_id, members, "traces")
    assert svc.r.get(keys.sim_effects(key)) == b"1"
    assert svc.r.get(keys.idempotency(key)) == res.winner_id.encode()
    succeeded = [mid for mid, t in traced.items() if t.status is MemberStatus.SUCCEEDED]
    assert succeeded == [res.winner_id]
    for mid in members - {res.winner_id}:
        assert traced[mid].status is MemberStatus.CANCELLED
        assert f"already taken by {res.winner_id}" in (traced[mid].failure_reason or "")


def test_budget_is_shared_by_two_coordinator_processes(svc: Services, tmp_path: Path) -> None:
    script = tmp_path / "coordinate.py"
    script.write_text(BUDGET_SCRIPT, encoding="utf-8")
    argv = [sys.executable, str(script), svc.url, str(svc.pool_file), str(BURST)]
    pipe = subprocess.PIPE
    procs = [subprocess.Popen(argv, stdout=pipe, stderr=pipe, text=True) for _ in range(2)]
    outs = [finish(proc, 60)[0] for proc in procs]
    backups = [n for out in outs for n in json.loads(out)]
    assert len(backups) == 4
    # Each invocation wanted two backups (eight in all); the shared bucket paid for three.
    assert sum(backups) == BURST, f"backups per invocation: {backups}"
    snap = RedisBudget(svc.r, svc.settings(budget_burst=BURST)).snapshot()
    assert snap.spent_backups == BURST
    assert snap.exhausted >= 1


def test_worker_killed_mid_task(svc: Services) -> None:
    # The coordinator learns that rank 0 started from its start token, sent
    # started_notice_delay_s after the start, or, when the kill comes first, at its start
    # timeout (start_timeout_min_s, 2 s), from the start claim its worker holds. Its
    # patience runs from then, so rank 1 wins at about 1.1 s or 3.1 s: the deadline
    # leaves room for both.
    zone, deadline_s = "regional", 5.0
    handle = svc.client.submit("doomed", "hi", deadline_s=deadline_s)
    claim = keys.idempotency(liveness.start_key(f"{handle.id}.0"))
    # Killed once started: a member only taken from its queue is not started, and its
    # zone would be declared dark instead.
    wait_for(f"the {zone} worker to start its member", lambda: svc.r.get(claim) is not None, 5)
    proc = svc.stack.workers[zone]
    proc.kill()
    proc.wait()
    try:
        res = handle.result(timeout_s=deadline_s + 10)
    finally:
        svc.restart_worker(zone)
    # Rank 0 would have won at 1.2 s; killed before, its report never comes, so rank 1
    # wins when rank 0's patience runs out (issue 8: max(patience_min_s = 1 s, 4 × its
    # cold t_proc) after it started), before the deadline (a kill after rank 0 finished
    # would show as rank 0 winning).
    assert svc.r.get(claim) == liveness.WORKER.encode()
    assert res.state is GroupState.WON
    assert (res.winner_id, res.zone) == (f"{res.group_id}.1", "local")
    assert res.latency_s < deadline_s
    lost = res.members[0]
    assert lost.status in (MemberStatus.TIMED_OUT, MemberStatus.FAILED)
    assert lost.reason == "no report within its patience (1 s after it started)"


def p95(latencies: Sequence[float]) -> float:
    return sorted(latencies)[max(0, math.ceil(0.95 * len(latencies)) - 1)]


def test_a_zone_that_goes_dark_is_routed_around(svc: Services) -> None:
    """Issue 8: the only worker of the best-ranked zone is SIGKILLed between invocations
    (its candidate judged 0.85, as fast as the others judged 0.6).
    Its members are never started: each group gives them up at the start timeout (not
    its deadline), records the loss on the link to that zone, and within a few
    invocations the zone ranks below a live one and latency is back to what it was."""
    zone, deadline_s, n_after = "global", 3.0, 30
    settings = svc.settings(start_timeout_min_s=0.3)
    with HacoClient(settings, redis_url=svc.url) as client:
        before = [client.invoke("dark", "hi", deadline_s=deadline_s) for _ in range(8)]
        assert {r.zone for r in before[-4:]} == {zone}  # the best candidate, ranked first
        proc = svc.stack.workers[zone]
        proc.kill()  # SIGKILL: no goodbye, its queue is simply no longer consumed
        proc.wait()
        try:
            after = [client.invoke("dark", "hi", deadline_s=deadline_s) for _ in range(n_after)]
        finally:
            svc.restart_worker(zone)
    assert all(r.state is GroupState.WON and r.zone != zone for r in after)
    # Not even the first invocation waited for its deadline: the start timeout bounds it.
    assert max(r.latency_s for r in after) < deadline_s / 2
    # The first one still ranked the dark zone first: it waited for the start timeout.
    gave_up = [m for m in after[0].members if m.zone == zone and m.reason]
    assert gave_up and gave_up[0].reason.startswith("not started within"), after[0].members
    assert after[0].latency_s >= 0.3
    # Within 20 invocations the p95 is back within 1.5x of before the kill: the p95 of
    # the 20 after the first 10 (a p95 of 20 tolerates one outlier: a loaded machine).
    # (The first ones after the kill may still rank the dark zone first, or re-explore
    # it, until the losses recorded at their members' start timeouts add up.)
    base = p95([r.latency_s for r in before[2:]])
    back = [r.latency_s for r in after[10:]]
    assert p95(back) <= 1.5 * base + 0.01, (base, back)
    # The losses left traces (for the recompute): on the link, not against the service.
    lost = [m.member_id for r in after for m in r.members if m.zone == zone and m.reason]
    traced = wait_reports(svc.r, after[0].group_id, {lost[0]}, "traces")[lost[0]]
    assert (traced.failure_kind, traced.lost) == (FailureKind.NETWORK, True)


def test_cli_invoke_prints_the_outcome(services: Services, tmp_path: Path) -> None:
    # The default pool (the paper's scenario) through the same workers.
    argv = [HACO, "invoke", "--role", "coder", "--message", "hi", "--deadline-s", "20"]
    env, pipe = clean_env(HACO_REDIS_URL=services.url), subprocess.PIPE
    proc = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=pipe, stderr=pipe, text=True)
    out, _ = finish(proc, 60)
    result = json.loads(out)
    assert result["winner_id"].startswith(result["group_id"])
    assert result["state"] == "won"


def test_no_app_key_without_ttl(services: Services) -> None:
    """Runs last: every key in DB 0, left by the tests above and by one more invocation
    that writes every kind of key, expires. DB 1 is excluded by design: it is Celery's
    broker, whose queues, bindings and unacked-message hash are kombu's own and never
    expire (coordinator/state/keys.py)."""
    r = services.r
    key = f"effect-{uuid.uuid4().hex}"
    res = services.client.invoke("effect", "hi", deadline_s=10, idempotency_key=key)
    wait_reports(r, res.group_id, {m.member_id for m in res.members}, "traces")
    names = list(r.scan_iter())
    kinds = {keys.idempotency(key), keys.sim_effects(key), keys.group_state(res.group_id)}
    kinds |= {keys.group_winner(res.group_id), keys.TRACES, keys.METRICS, keys.BUDGET}
    kinds.add(keys.hedge_delay_window("effect"))
    assert kinds <= {n.decode() for n in names}
    assert any(n.startswith(b"haco:prof:") for n in names)
    forever = [n for n in names if r.pttl(n) == -1]  # -2: expired meanwhile, fine
    assert not forever, f"keys without a TTL: {forever}"


def test_ainvoke_awaits_many_invocations_on_the_reply_hub(svc: Services) -> None:
    async def run() -> tuple[list[InvocationResult | BaseException], int]:
        hub = svc.client.hubs.current()
        calls = [svc.client.ainvoke("effect", "hi", deadline_s=20) for _ in range(40)]
        results = await asyncio.gather(*calls, return_exceptions=True)
        named = f"haco-hub-{hub.id}"
        connections = sum(1 for c in svc.r.client_list() if c.get("name", "").startswith(named))
        await svc.client.hubs.aclose()
        return results, connections

    results, connections = asyncio.run(run())
    assert [r for r in results if isinstance(r, BaseException)] == []
    assert {r.state for r in results if isinstance(r, InvocationResult)} == {GroupState.WON}
    assert 0 < connections <= svc.client.settings.hub_shards + 2

    async def broken() -> InvocationResult:
        try:
            return await svc.client.ainvoke("broken", "hi", deadline_s=10)
        finally:
            await svc.client.hubs.aclose()

    with pytest.raises(AllFailedError) as info:
        asyncio.run(broken())
    # every launched member's reason (a zone found dark earlier may still sit out)
    gid, failures = info.value.group_id, info.value.failures
    assert failures and all(m.startswith(f"{gid}.") for m in failures)
    assert set(failures.values()) == {"the service failed"}


def test_running_members_are_listed_by_celerys_active_inspect(svc: Services) -> None:
    # A lane worker lists its members as Celery's consumer lists its tasks: `celery
    # inspect active`, Flower's worker page and `haco zones`' in-flight counts see them.
    queue = keys.queue_for("regional")
    seen: list[dict[str, Any]] = []

    def listed() -> bool:
        view = inspect_workers(svc.client.app, 1.0)
        seen[:] = [t for tasks in view.active.values() for t in tasks or []]
        return view.running(queue) >= 1

    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(svc.client.invoke, "late", "hi", deadline_s=10)
        wait_for("the regional member listed as active", listed, 5)
        assert future.result(timeout=15).state is GroupState.WON
    member = next(t for t in seen if t["delivery_info"]["routing_key"] == queue)
    assert member["name"] == keys.MEMBER_TASK and member["id"]
