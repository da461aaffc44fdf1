"""The judge (workers.judge, the haco.judge queue): a judged score moves μ as the
spec says (α += q, β += 1 − q) without counting a call; a redelivered judgement counts
once (the members row's judged_at guard); user, LLM and simulated scorers; and a real
`haco worker --judge` process judging a harvested member end to end.

Real services (tests/services.py): a fresh Postgres database for this module and this
run's own Redis database; the end-to-end test runs its worker on a whole Redis server of
the run's own, because workers use fixed database numbers (keys.APP_DB, keys.BROKER_DB)."""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
import redis
from polling import wait_for
from psycopg_pool import ConnectionPool
from services import flush_runtime_dbs
from typer.testing import CliRunner

from coordinator.cli.main import app as cli_app
from coordinator.config import HacoSettings
from coordinator.core.params import DecayUnit, ProfileSettings
from coordinator.core.profiles import (
    CandidateObservation,
    CandidateProfile,
    apply_quality,
    update_candidate,
)
from coordinator.errors import ConfigError, InputError, ScoreError
from coordinator.runtime.pool import Pool, load_pool
from coordinator.state import keys
from coordinator.state.broker import with_db
from coordinator.state.keys import JUDGE_QUEUE, JUDGE_TASK
from coordinator.state.memstore import MemoryStore
from coordinator.state.store import RedisStore
from coordinator.tracestore.harvester import Harvester
from schemas.enums import FailureKind
from schemas.models import Candidate, MemberTask, Message
from sim.scenario import load_builtin
from workers.app import create_app, judge_task_for
from workers.backends.base import BackendResult, StopCheck
from workers.judge import (
    CallableScorer,
    JudgeTask,
    LLMJudge,
    Outcome,
    SimJudge,
    apply_judgement,
    judge_member,
    parse_score,
)
from workers.member import MemberContext, execute_member

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
TTL = 600.0
T0 = 1_700_000_000.123456789  # finer than Postgres' microseconds: matched as traced
REQUEST = [Message(role="user", content="write a haiku about hedging")]
INF = ProfileSettings()


# ---------------------------------------------------------------- fixtures and helpers


@pytest.fixture
def conn(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_url, autocommit=True) as c:
        yield c


@pytest.fixture
def redis_store(redis_db: redis.Redis) -> RedisStore:
    return RedisStore(redis_db)


def insert_member(
    conn: psycopg.Connection[Any], member_id: str, candidate_id: str, quality: float | None = None
) -> None:
    """A members row as the harvester writes it (finished_at = to_timestamp(traced s))."""
    conn.execute(
        "INSERT INTO members (member_id, group_id, candidate_id, role, zone, caller_zone,"
        " model, rank, started_at, finished_at, status, quality, latency_s, stream_id)"
        " VALUES (%s, 'g', %s, 'coder', 'local', 'local', 'm', 0, to_timestamp(%s),"
        " to_timestamp(%s), 'succeeded', %s, 0.5, '1-0')",
        (member_id, candidate_id, T0 - 1, T0, quality),
    )


def row(conn: psycopg.Connection[Any], member_id: str) -> tuple[Any, ...]:
    got = conn.execute(
        "SELECT quality, judged_at IS NOT NULL FROM members WHERE member_id = %s", (member_id,)
    ).fetchone()
    assert got is not None
    return tuple(got)


def called(profile: CandidateProfile) -> CandidateProfile:
    """A profile that has seen one successful call without a quality (a real backend)."""
    obs = CandidateObservation(at_s=T0, delivered=True, proc_latency_s=0.4, tokens_out=10)
    return update_candidate(profile, obs, INF)


def mu(p: CandidateProfile) -> float:
    return p.alpha / (p.alpha + p.beta)


class CountingScorer:
    def __init__(self, q: float) -> None:
        self.q, self.calls = q, 0

    def score(self, request: list[Message], output: str) -> float:
        self.calls += 1
        return self.q


# ------------------------------------------------------------- the Beta update (spec §2)


def test_a_judged_score_moves_mu_as_the_spec_says() -> None:
    prof = called(CandidateProfile("c"))
    alpha, beta = prof.alpha, prof.beta
    for q in (0.8, 0.25, 1.0, 0.0):
        nxt = apply_quality(prof, q, INF, at_s=T0)
        assert nxt.alpha == pytest.approx(prof.alpha + q)
        assert nxt.beta == pytest.approx(prof.beta + 1.0 - q)
        assert mu(nxt) == pytest.approx(nxt.alpha / (nxt.alpha + nxt.beta))
        prof = nxt
    assert (prof.alpha, prof.beta) == pytest.approx((alpha + 2.05, beta + 1.95))
    assert mu(prof) == pytest.approx((1 + 2.05) / (2 + 4))
    assert prof.quality.n == 4 and prof.mean_quality == pytest.approx(2.05 / 4)


def test_a_judgement_counts_no_call() -> None:
    before = called(CandidateProfile("c"))
    after = apply_quality(before, 0.7, INF, at_s=T0)
    unchanged = ("calls", "delivered", "successes", "internal_failures", "network_failures")
    unchanged += ("deadline_failures", "latency", "tokens_in", "tokens_out", "recent_latency_s")
    unchanged += ("observations", "last_seen_s")
    for name in unchanged:
        assert getattr(after, name) == getattr(before, name), name
    assert after.calls == 1.0
    with pytest.raises(InputError, match=r"1\.5"):
        apply_quality(before, 1.5, INF, at_s=T0)
    with pytest.raises(InputError, match="nan"):
        apply_quality(before, math.nan, INF, at_s=T0)


def test_a_late_judgement_weighs_what_its_call_weighs_now() -> None:
    hourly = ProfileSettings(half_life=3600.0, decay_unit=DecayUnit.SECONDS)
    prof = dataclasses.replace(called(CandidateProfile("c")), last_seen_s=T0 + 3600.0)
    old = apply_quality(prof, 1.0, hourly, at_s=T0)  # one half-life older than the profile
    assert (old.alpha - prof.alpha, old.beta - prof.beta) == pytest.approx((0.5, 0.0))
    new = apply_quality(prof, 1.0, hourly, at_s=T0 + 7200.0)
    assert new.alpha - prof.alpha == pytest.approx(1.0)
    by_obs = ProfileSettings(half_life=3.0)
    assert apply_quality(prof, 0.6, by_obs, at_s=T0).alpha == pytest.approx(prof.alpha + 0.6)


def test_stores_apply_quality_like_the_pure_function(redis_store: RedisStore) -> None:
    memory = MemoryStore()
    obs = CandidateObservation(at_s=T0, delivered=True, proc_latency_s=0.4, tokens_out=10)
    for store in (redis_store, memory):
        store.update_candidate("c", obs, INF, TTL)
        store.apply_quality("c", 0.9, INF, TTL, T0)
        store.apply_quality("fresh", 0.3, INF, TTL, T0)  # no profile yet: from the prior
    want = apply_quality(called(CandidateProfile("c")), 0.9, INF, T0)
    for store in (redis_store, memory):
        got, _ = store.load_profiles(["c", "fresh"], [])
        assert got["c"] == want
        assert (got["fresh"].alpha, got["fresh"].beta, got["fresh"].calls) == (1.3, 1.7, 0.0)
    written = list(redis_store.r.scan_iter("haco:*"))
    assert written and all(0 < redis_store.r.pttl(k) <= TTL * 1000 for k in written)


# ------------------------------------------------------- the row guard (exactly once)


@pytest.mark.parametrize("kind", ["redis", "memory"])
def test_a_redelivered_judgement_is_applied_once(
    kind: str, conn: psycopg.Connection[Any], redis_store: RedisStore
) -> None:
    store = redis_store if kind == "redis" else MemoryStore()
    member, cand = f"g-{kind}.0", f"coder-{kind}"
    insert_member(conn, member, cand)
    assert apply_judgement(store, conn, member, cand, T0, 0.8, ttl_s=TTL) is Outcome.APPLIED
    for _ in range(3):  # redeliveries
        assert apply_judgement(store, conn, member, cand, T0, 0.3, ttl_s=TTL) is Outcome.DUPLICATE
    prof = store.load_profiles([cand], [])[0][cand]
    assert (prof.alpha, prof.beta, prof.calls) == pytest.approx((1.8, 1.2, 0.0))
    assert row(conn, member) == (0.8, True)


def test_a_missing_or_backend_judged_row_is_not_applied(conn: psycopg.Connection[Any]) -> None:
    store = MemoryStore()
    assert apply_judgement(store, conn, "nope.0", "c", T0, 0.5) is Outcome.NOT_FOUND
    insert_member(conn, "simjudged.0", "c", quality=0.6)  # the simulator judged it
    assert apply_judgement(store, conn, "simjudged.0", "c", T0, 0.5) is Outcome.DUPLICATE
    assert apply_judgement(store, conn, "nope.0", "c", T0 + 1e-3, 0.5) is Outcome.NOT_FOUND
    assert store.candidates == {}
    insert_member(conn, "other.0", "c")
    with pytest.raises(InputError, match="of candidate 'c', not 'd'"):
        apply_judgement(store, conn, "other.0", "d", T0, 0.5)
    with pytest.raises(ScoreError, match=r"1\.2"):
        apply_judgement(store, conn, "other.0", "c", T0, 1.2)
    assert row(conn, "other.0") == (None, False)


def test_apply_judgement_needs_autocommit(pg_url: str) -> None:
    with psycopg.connect(pg_url) as c, pytest.raises(InputError, match="autocommit"):
        apply_judgement(MemoryStore(), c, "m", "c", T0, 0.5)


def test_judge_member_scores_only_rows_awaiting_a_judgement(
    conn: psycopg.Connection[Any],
) -> None:
    store, scorer = MemoryStore(), CountingScorer(0.75)
    task = JudgeTask(
        member_id="jm.0", candidate_id="jm", finished_at_s=T0, request=REQUEST, output="x"
    )
    assert judge_member(task, scorer, store, conn).outcome is Outcome.NOT_FOUND
    assert scorer.calls == 0  # a retry before the harvest costs no evaluator call
    insert_member(conn, "jm.0", "jm")
    done = judge_member(task, scorer, store, conn)
    assert (done.outcome, done.score, scorer.calls) == (Outcome.APPLIED, 0.75, 1)
    assert judge_member(task, scorer, store, conn).outcome is Outcome.DUPLICATE
    assert scorer.calls == 1
    insert_member(conn, "bad.0", "jm")
    bad = task.model_copy(update={"member_id": "bad.0"})
    done = judge_member(bad, CallableScorer("scorers_example:too_high"), store, conn)
    assert done.outcome is Outcome.UNSCORED and "1.5" in (done.reason or "")
    assert row(conn, "bad.0") == (None, False)
    assert store.candidates["jm"].alpha == pytest.approx(1.75)


# -------------------------------------------------------------------- user scorers


def test_callable_scorer_imports_by_path_and_checks_the_value() -> None:
    scorer = CallableScorer("scorers_example:length_score")
    assert scorer.score(REQUEST, "x" * 42) == pytest.approx(0.42)
    for name, shown in [("too_high", "1.5"), ("not_a_number", "'excellent'"), ("nan_score", "nan")]:
        with pytest.raises(InputError, match=shown) as info:
            CallableScorer(f"scorers_example:{name}").score(REQUEST, "x")
        assert f"scorers_example:{name}" in str(info.value)
    with pytest.raises(ScoreError, match="the checker crashed"):
        CallableScorer("scorers_example:broken").score(REQUEST, "x")


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("scorers_example:no_such_function", "cannot be imported"),
        ("no_such_module_xyz:score", "cannot be imported"),
        ("scorers_example", "expected an import path"),
        ("scorers_example:NOT_A_FUNCTION", "not a function"),
    ],
)
def test_a_bad_scorer_path_is_a_config_error_naming_it(path: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why) as info:
        CallableScorer(path)
    assert repr(path) in str(info.value)


def write_pool(folder: Path, evaluator: str, extra: str = "") -> Path:
    path = folder / "pool.toml"
    path.write_text(
        'caller_zone = "local"\nzones = ["local"]\n\n[[candidates]]\nid = "coder-0"\n'
        'role = "coder"\nmodel = "m"\nzone = "local"\nbackend = { kind = "http" }\n'
        f"{extra}\n[evaluator]\n{evaluator}\n",
        encoding="utf-8",
    )
    return path


def test_the_pool_config_checks_its_evaluator_at_load(tmp_path: Path) -> None:
    bad = write_pool(tmp_path, 'scorer = "callable"\ncallable = "scorers_example:nope"')
    with pytest.raises(
        ConfigError, match="evaluator: callable 'scorers_example:nope' cannot be imported"
    ):
        load_pool(bad)
    with pytest.raises(ConfigError, match="scorer='llm' needs candidate"):
        load_pool(write_pool(tmp_path, 'scorer = "llm"'))
    with pytest.raises(ConfigError, match="'judge-0' is not in evaluators"):
        load_pool(write_pool(tmp_path, 'scorer = "llm"\ncandidate = "judge-0"'))
    with pytest.raises(ConfigError, match="placeholder"):
        load_pool(write_pool(tmp_path, 'scorer = "callable"\ncallable = "x:y"\nprompt = "hi"'))
    with pytest.raises(ConfigError, match="sim section"):
        load_pool(write_pool(tmp_path, 'scorer = "sim"'))
    judge = (
        '[[evaluators]]\nid = "judge-0"\nrole = "evaluator"\nmodel = "gpt-4o"\n'
        'zone = "local"\nbackend = { kind = "http" }\n'
    )
    pool = load_pool(write_pool(tmp_path, 'scorer = "llm"\ncandidate = "judge-0"', judge))
    assert pool.evaluator is not None and pool.evaluator.candidate == "judge-0"
    assert "{request}" in pool.evaluator.prompt
    assert Pool(pool).by_role == {"coder": list(pool.candidates)}  # never hedged as a role
    ok = load_pool(write_pool(tmp_path, 'scorer = "callable"\ncallable = "scorers_example:broken"'))
    assert ok.evaluator is not None and ok.evaluator.scorer == "callable"


# ------------------------------------------------------------------------ LLM judge


@pytest.mark.parametrize(
    ("answer", "want"),
    [
        ("Score: 7/10", 0.7),
        ("The answer is fine.\n**Score**: 8 / 10", 0.8),
        ("score = 0.65", 0.65),
        ("Score: 7", 0.7),
        ("Score: 85%", 0.85),
        ("Score: 3 out of 5", 0.6),
        ('{"score": 0.7}', 0.7),
        ('```json\n{"reason": "ok", "score": 9}\n```', 0.9),
        ("First thoughts: Score: 2/10. On reflection...\nFinal Score: 6/10", 0.6),
        ("  9/10 ", 0.9),
        ("1.0", 1.0),
    ],
)
def test_llm_answers_are_parsed_and_normalized(answer: str, want: float) -> None:
    assert parse_score(answer) == pytest.approx(want)


@pytest.mark.parametrize(
    "answer",
    ["I cannot judge this.", "Score: 12/10", "Score: /10", "", '{"score": "high"}', "Score: 3/0"],
)
def test_a_malformed_llm_answer_is_not_a_score(answer: str) -> None:
    with pytest.raises(ScoreError):
        parse_score(answer)


class AnsweringBackend:
    """An evaluator backend that answers every prompt with ``answer`` (or fails)."""

    def __init__(self, answer: str | None, failure: FailureKind | None = None) -> None:
        self.answer, self.failure = answer, failure
        self.prompts: list[str] = []

    def call(self, task: MemberTask, should_stop: StopCheck) -> BackendResult:
        self.prompts.append(task.payload[0].content)
        if self.failure is not None:
            return BackendResult(self.failure, "evaluator down")
        return BackendResult(None, output=self.answer, quality=None)

    def commit(self, task: MemberTask) -> None:
        raise AssertionError("a judge call has no side effect")


def test_llm_judge_prompts_the_evaluator_and_parses_its_answer() -> None:
    judge_c = Candidate(id="judge-0", role="evaluator", model="gpt-4o", zone="local")
    backend = AnsweringBackend("Reasoning...\nScore: 9/10")
    judge = LLMJudge(backend, judge_c)
    tricky = [Message(role="user", content="echo {output} literally")]
    assert judge.score(tricky, "the output") == pytest.approx(0.9)
    (prompt,) = backend.prompts
    assert "user: echo {output} literally" in prompt  # one pass: never substituted twice
    assert "RESPONSE:\nthe output" in prompt and "Score: <integer 0-10>/10" in prompt
    with pytest.raises(ScoreError, match="no score"):
        LLMJudge(AnsweringBackend("looks good to me"), judge_c).score(REQUEST, "x")
    with pytest.raises(ScoreError, match=r"'judge-0' failed .*evaluator down"):
        LLMJudge(AnsweringBackend(None, FailureKind.INTERNAL), judge_c).score(REQUEST, "x")


# ------------------------------------------------------------------------ sim judge


def test_sim_judge_noise_grows_with_a_weaker_evaluator() -> None:
    scen = load_builtin("overall")
    outputs = [f"output {i}" for i in range(20)]

    def spread(model: str) -> float:
        judge = SimJudge.for_model(scen, model, np.random.default_rng(3))
        errors = [
            judge.score(REQUEST, out) - SimJudge.stand_in_quality(REQUEST, out)
            for out in outputs
            for _ in range(200)
        ]
        return float(np.std(errors))

    strong, weak = spread("gpt-4o"), spread("llama-3.1-8b-instruct")
    assert scen.models["gpt-4o"].judge_noise < scen.models["llama-3.1-8b-instruct"].judge_noise
    assert strong == pytest.approx(scen.models["gpt-4o"].judge_noise, rel=0.1)
    assert weak > 3 * strong
    assert SimJudge.for_model(scen).judge_noise == scen.models[scen.evaluator.model].judge_noise
    with pytest.raises(ConfigError, match="'nope'"):
        SimJudge.for_model(scen, "nope")


def test_sim_judge_is_deterministic_and_in_range() -> None:
    a = SimJudge(0.3, np.random.default_rng(5))
    b = SimJudge(0.3, np.random.default_rng(5))
    scores = [a.score(REQUEST, f"o{i}") for i in range(500)]
    assert scores == [b.score(REQUEST, f"o{i}") for i in range(500)]
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert SimJudge(0.0, np.random.default_rng()).score(REQUEST, "o") == (
        SimJudge.stand_in_quality(REQUEST, "o")
    )


# ------------------------------------------------------------ enqueue from a member


class OkBackend:
    def __init__(self, quality: float | None, ok: bool = True) -> None:
        self.quality, self.ok = quality, ok

    def call(self, task: MemberTask, should_stop: StopCheck) -> BackendResult:
        if not self.ok:
            return BackendResult(FailureKind.INTERNAL, "broken")
        return BackendResult(None, output="x" * 42, quality=self.quality, proc_latency_s=0.1)

    def commit(self, task: MemberTask) -> None:
        pass


def member_task(group: str) -> MemberTask:
    cand = Candidate(id="coder-0", role="coder", model="m", zone="local")
    now = time.time()
    return MemberTask(
        group_id=group, member_id=f"{group}.0", rank=0, candidate=cand, caller_zone="local",
        payload=REQUEST, deadline_at_s=now + 30, enqueued_at_s=now,
    )  # fmt: skip


def run_member(backend: Any, judge: Callable[[MemberTask, Any], None] | None) -> MemoryStore:
    store, settings = MemoryStore(), HacoSettings()
    ctx = MemberContext(store=store, backends=lambda _t: backend, settings=settings, judge=judge)
    task = member_task(f"g{uuid.uuid4().hex[:8]}")
    store.open_group(task.group_id, TTL)
    execute_member(task, ctx)
    return store


def test_members_without_a_quality_are_sent_to_the_judge() -> None:
    sent: list[JudgeTask] = []

    def judge(task: MemberTask, report: Any) -> None:
        sent.append(judge_task_for(task, report))

    store = run_member(OkBackend(None), judge)
    (jt,) = sent
    assert (jt.candidate_id, jt.output, jt.request) == ("coder-0", "x" * 42, REQUEST)
    prof = store.candidates["coder-0"]
    assert (prof.calls, prof.alpha, prof.beta) == (1.0, 1.0, 1.0)  # counted, not judged
    run_member(OkBackend(0.6), judge)  # judged by its backend (the simulator)
    run_member(OkBackend(None, ok=False), judge)  # failed: nothing to judge
    assert len(sent) == 1
    run_member(OkBackend(None), None)  # no evaluator configured: nothing sent

    def unreachable(task: MemberTask, report: Any) -> None:
        raise redis.ConnectionError("broker down")

    store = run_member(OkBackend(None), unreachable)  # logged; the member is unaffected
    assert len(store.traces) == 1


# ------------------------------------------------------------------------- the CLI


def test_worker_takes_a_zone_or_the_judge(tmp_path: Path) -> None:
    runner = CliRunner()
    clean = {k: None for k in os.environ if k.startswith("HACO_")}
    res = runner.invoke(cli_app, ["worker"], env=clean)
    assert res.exit_code == 2 and "either --zone ZONE" in res.output
    res = runner.invoke(cli_app, ["worker", "--zone", "local", "--judge"], env=clean)
    assert res.exit_code == 2 and "either --zone ZONE" in res.output
    res = runner.invoke(cli_app, ["worker", "--judge"], env=clean)
    assert res.exit_code == 2 and "defines no evaluator" in res.output
    pool = write_pool(tmp_path, 'scorer = "callable"\ncallable = "scorers_example:length_score"')
    env = {**clean, "HACO_POOL_FILE": str(pool), "HACO_STATE_DIR": str(tmp_path / "none")}
    res = runner.invoke(cli_app, ["worker", "--judge"], env=env)
    assert res.exit_code == 1 and "HACO_DATABASE_URL is unset" in res.output


# ------------------------------------------------------- a real judge worker, end to end


def harvest(client: redis.Redis, pg_url: str, settings: HacoSettings) -> None:
    pool = ConnectionPool(pg_url, min_size=1, max_size=1, open=False)
    pool.open(wait=True, timeout=30)
    try:
        Harvester(client, pool, settings, "judge-test").run_once()
    finally:
        pool.close()


def test_a_judge_worker_judges_a_harvested_member(
    pg_url: str, runtime_redis_url: str, tmp_path: Path
) -> None:
    pool_file = write_pool(
        tmp_path, 'scorer = "callable"\ncallable = "scorers_example:length_score"'
    )
    url = runtime_redis_url  # a server of this run's own: workers use its DB 0 and 1
    flush_runtime_dbs(url)
    settings = HacoSettings(
        redis_url=url, database_url=pg_url, pool_file=pool_file, harvest_block_ms=50
    )
    client = redis.Redis.from_url(with_db(url, keys.APP_DB))
    store, celery = RedisStore(client), create_app(settings, url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HACO_")}
    env |= {"HACO_REDIS_URL": url, "HACO_DATABASE_URL": pg_url}
    env |= {"HACO_POOL_FILE": str(pool_file), "PYTHONPATH": str(TESTS)}
    argv = [sys.executable, "-m", "coordinator.cli.main", "worker", "--judge"]
    argv += ["--concurrency", "2"]
    with (tmp_path / "judge.log").open("wb") as log:
        proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        _judge_end_to_end(store, client, celery, pg_url, settings, tmp_path / "judge.log")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        celery.close()
        client.close()


def _judge_end_to_end(
    store: RedisStore,
    client: redis.Redis,
    celery: Any,
    pg_url: str,
    settings: HacoSettings,
    log: Path,
) -> None:
    # A zone worker's member, as it runs there: counted, traced, and sent to the judge
    # (the real runtime's sender, from the pool's [evaluator]).
    node = f"haco-judge@{socket.gethostname()}"
    wait_for("the judge worker", lambda: bool(celery.control.ping([node], timeout=0.5)))
    runtime = celery.conf.haco_runtime
    try:
        _judged_in_process(store, client, celery, pg_url, settings, log, runtime)
    finally:
        runtime.close()  # its cancel watcher, before the test's Redis goes away


def _judged_in_process(
    store: RedisStore,
    client: redis.Redis,
    celery: Any,
    pg_url: str,
    settings: HacoSettings,
    log: Path,
    runtime: Any,
) -> None:
    def metric(name: str) -> int:
        return store.metrics().get(name, 0)

    ctx = dataclasses.replace(runtime.context(), backends=lambda _t: OkBackend(None))
    task = member_task("e2e")
    store.open_group(task.group_id, TTL)
    report = execute_member(task, ctx)
    assert report.trace.quality is None and report.output == "x" * 42
    # The judge looks before the harvest: the row is not there yet, so it retries.
    wait_for("a retry", lambda: metric("judge_not_found") >= 1)
    harvest(client, pg_url, settings)
    wait_for("the judgement", lambda: metric("judge_applied") == 1)
    prof = store.load_profiles(["coder-0"], [])[0]["coder-0"]
    assert (prof.alpha, prof.beta, prof.calls) == pytest.approx((1.42, 1.58, 1.0))
    with psycopg.connect(pg_url) as c:
        assert row(c, task.member_id) == (0.42, True)
    # A redelivery, and a payload that is not a judge task.
    payload = judge_task_for(task, report).model_dump(mode="json")
    celery.send_task(JUDGE_TASK, args=[payload], queue=JUDGE_QUEUE)
    celery.send_task(JUDGE_TASK, args=[{"member_id": ""}], queue=JUDGE_QUEUE)
    wait_for("the duplicate", lambda: metric("judge_duplicate") == 1)
    assert store.load_profiles(["coder-0"], [])[0]["coder-0"] == prof
    assert metric("judge_applied") == 1
    wait_for("the rejection", lambda: b"rejected judge task payload" in log.read_bytes())
