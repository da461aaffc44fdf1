"""The Celery app, defined explicitly: no ``shared_task``, no default app.

One queue per zone, ``haco.zone.<zone>``, consumed by the workers of that zone. Member
tasks are acknowledged late and rejected (requeued) when their worker is lost, one at a
time per worker thread; their results are ignored — members reply on their group's
Redis list, which is the only reply path. The broker is Redis database
:data:`coordinator.state.keys.BROKER_DB`, apart from HACO's own keys.

The judge queue ``haco.judge`` (`haco worker --judge`) scores successful members that
came back without a quality, when the pool config has an ``[evaluator]``
(:mod:`workers.judge`); its worker also needs the trace store (HACO_DATABASE_URL or
the embedded Postgres). Counters ``judge_<outcome>`` go to ``keys.METRICS``.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import redis
from celery import Celery, signals
from pydantic import ValidationError

from coordinator.config import HacoSettings
from coordinator.errors import ConfigError, DatabaseError, InputError, StoreError
from coordinator.runtime.pool import pool_from_settings, sim_scenario
from coordinator.services import embedded_pg
from coordinator.state import keys
from coordinator.state.broker import BROKER_TRANSPORT, celery_conf, with_db
from coordinator.state.cancelwatch import RedisCancelWatcher
from coordinator.state.codec import text
from coordinator.state.hedgedelay import RedisDelayWindow
from coordinator.state.keys import JUDGE_QUEUE, JUDGE_TASK, MEMBER_TASK
from coordinator.state.lean import close_lean, lean_for
from coordinator.state.memberops import BrokerAck
from coordinator.state.store import RedisStore
from coordinator.tracestore.db import connect
from schemas.backends import ENDPOINT_SETTINGS
from schemas.models import Candidate, MemberReport, MemberTask
from schemas.pool import PoolConfig, SimSection
from workers.backends.base import Backend
from workers.backends.openai import ChatBackend
from workers.backends.simulated import SimBackend
from workers.backends.transport import PoolLimits, make_client
from workers.judge import (
    CallableScorer,
    Judged,
    JudgeTask,
    LLMJudge,
    Outcome,
    Scorer,
    SimJudge,
    judge_member,
)
from workers.lane import MemberLane, lane_step
from workers.maintenance import register_maintenance
from workers.member import LaneStarts, MemberContext, execute_member
from workers.probe import Probing

# A judge task that finds no member row (not harvested yet), or cannot reach Postgres or
# Redis, is retried after 0.5 s, doubling up to 60 s, at most 25 times (~19 min).
JUDGE_RETRY_FIRST_S, JUDGE_RETRY_MAX_S, JUDGE_MAX_RETRIES = 0.5, 60.0, 25
log = logging.getLogger(__name__)
JudgeSender = Callable[[dict[str, Any]], None]


def judge_task_for(task: MemberTask, report: MemberReport) -> JudgeTask:
    t = report.trace
    return JudgeTask(
        member_id=t.member_id,
        candidate_id=t.candidate_id,
        finished_at_s=t.finished_at_s,
        request=task.payload,
        output=report.output or "",
        group_id=task.group_id,
    )


class WorkerRuntime:
    """Per-process state of a worker, built on first use (no import-time side effects)."""

    def __init__(
        self,
        settings: HacoSettings,
        redis_url: str,
        send_judge: JudgeSender | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self._clock = clock
        self._faults_seen: Mapping[str, float] = {}
        self._faults_at = -math.inf  # when _faults_seen was read
        self.redis_url = redis_url
        self._lock = threading.RLock()
        self._ctx: MemberContext | None = None
        self._sims: dict[tuple[str, float], SimBackend] = {}
        self._client: redis.Redis | None = None
        self._pool: PoolConfig | None = None
        self._scorer: Scorer | None = None
        self._db_url: str | None = None
        self._send_judge = send_judge
        self._http: httpx.Client | None = None  # one per process, for every real endpoint
        self._chats: dict[str, ChatBackend] = {}  # candidate JSON -> its backend
        self._probing = Probing.from_settings(settings)  # real mode: RTT probe, outages

    def _redis(self) -> redis.Redis:
        with self._lock:
            if self._client is None:
                # Hundreds of member threads share a few connections: each holds one for a
                # command only (cancellation is the watcher's), waiting when all are busy.
                pool = redis.BlockingConnectionPool.from_url(
                    with_db(self.redis_url, keys.APP_DB),
                    max_connections=self.settings.worker_redis_connections,
                    timeout=self.settings.worker_redis_wait_s,
                )
                self._client = redis.Redis(connection_pool=pool)
                lean_for(self._client, self.settings.redis_hot_connections)
            return self._client

    def context(self) -> MemberContext:
        with self._lock:
            if self._ctx is None:
                client = self._redis()
                self._ctx = MemberContext(
                    store=RedisStore(client),
                    backends=self.backend_for,
                    settings=self.settings,
                    delays=RedisDelayWindow(client, self.settings),
                    delays_in_store=True,  # the same Redis: one round trip per report
                    judge=self._judge_sender(),
                    cancels=RedisCancelWatcher(
                        client,
                        self.settings.cancel_watch_idle_s,
                        self.settings.cancel_watch_retry_s,
                    ),
                )
            return self._ctx

    def close(self) -> None:
        """Stop the cancel watcher and close the process's connections (a worker's
        shutdown, or a test that ran members in-process); built again on next use."""
        with self._lock:
            ctx, http, client = self._ctx, self._http, self._client
            self._ctx = self._http = self._client = None
            self._chats.clear()
        if ctx is not None and ctx.cancels is not None:
            ctx.cancels.close()
        if http is not None:
            http.close()
        if client is not None:
            close_lean(client)
            client.close()

    def pool(self) -> PoolConfig:
        with self._lock:
            if self._pool is None:
                self._pool = pool_from_settings(self.settings)
            return self._pool

    def _judge_sender(self) -> Callable[[MemberTask, MemberReport], None] | None:
        send = self._send_judge
        if send is None or self.pool().evaluator is None:
            return None
        return lambda task, report: send(judge_task_for(task, report).model_dump(mode="json"))

    def scorer(self) -> Scorer:
        """The scorer the pool config's ``[evaluator]`` describes, built once."""
        with self._lock:
            if self._scorer is None:
                self._scorer = self._build_scorer(self.pool())
            return self._scorer

    def _build_scorer(self, pool: PoolConfig) -> Scorer:
        ev = pool.evaluator
        if ev is None:
            raise ConfigError("the pool config defines no evaluator: the judge has no scorer")
        if ev.scorer == "callable":
            return CallableScorer(ev.callable or "")
        if ev.scorer == "sim":
            return SimJudge.for_model(sim_scenario(pool.sim or SimSection()), ev.model)
        cand = next(c for c in pool.evaluators if c.id == ev.candidate)
        return LLMJudge(self.backend_for_candidate(cand), cand, ev.prompt)

    def judge(self, task: JudgeTask) -> Judged:
        """Score one member and apply it (workers.judge.judge_member); counted."""
        scorer, store = self.scorer(), RedisStore(self._redis())
        if self._db_url is None:
            self._db_url = embedded_pg.trace_store_url(self.settings)
        with connect(self._db_url) as conn:
            done = judge_member(
                task, scorer, store, conn, ttl_s=self.settings.profile_ttl_s,
                group_ttl_s=self.settings.group_ttl_s,
            )  # fmt: skip
        store.incr_metrics({f"judge_{done.outcome.value}": 1}, self.settings.profile_ttl_s)
        return done

    def _faults(self) -> Mapping[str, float]:
        now = self._clock()
        with self._lock:
            if now - self._faults_at < self.settings.sim_faults_refresh_s:
                return self._faults_seen
        raw = self._redis().hgetall(keys.SIM_FAULTS)
        faults = {text(k): float(v) for k, v in raw.items()}
        with self._lock:
            self._faults_seen, self._faults_at = faults, now
        return faults

    def _effect(self, task: MemberTask) -> None:
        key = keys.sim_effects(task.idempotency_key or task.member_id)
        pipe = self._redis().pipeline(transaction=True)
        pipe.incr(key)
        pipe.pexpire(key, int(self.settings.idempotency_ttl_s * 1000))
        pipe.execute()

    def backend_for(self, task: MemberTask) -> Backend:
        return self._probing.wrap(self.backend_for_candidate(task.candidate), task.candidate)

    def http_client(self) -> httpx.Client:
        """The process's HTTP client (workers.backends.transport), built on first use."""
        with self._lock:
            if self._http is None:
                s = self.settings
                limits = PoolLimits(
                    s.http_max_connections, s.http_max_keepalive, s.http_keepalive_expiry_s
                )
                self._http = make_client(limits)
            return self._http

    def _chat_backend(self, candidate: Candidate) -> ChatBackend:
        key = candidate.model_dump_json()
        with self._lock:
            if key not in self._chats:
                self._chats[key] = ChatBackend(candidate, self.http_client())
            return self._chats[key]

    def backend_for_candidate(self, candidate: Candidate) -> Backend:
        spec = candidate.backend
        if spec.kind in ENDPOINT_SETTINGS:
            return self._chat_backend(candidate)
        if spec.kind != "sim":
            raise InputError(f"backend kind {spec.kind!r} is not available in this worker")
        sim = SimSection.model_validate(spec.settings.get("sim", {}))
        scale = sim.time_scale or self.settings.sim_time_scale
        key = (sim.scenario, scale)
        with self._lock:
            if key not in self._sims:
                self._sims[key] = SimBackend(
                    sim_scenario(sim),
                    scale,
                    self.settings.cancel_poll_s,
                    self._faults,
                    commit_effect=self._effect,
                )
            return self._sims[key]


# The loggers of Celery's per-task INFO lines: a task received (the consumer's strategy)
# and a task succeeded (the tracer). Each reads its level once, when it is built.
TASK_LOGGERS = ("celery.worker.strategy", "celery.app.trace")


def quiet_task_logs(app: Celery, task_log: bool) -> None:
    """Celery's per-task INFO lines off in ``app``'s worker unless ``task_log``
    (HacoSettings.worker_task_log; bench/bare_celery.py applies the same)."""

    def quiet(sender: Any = None, **_: Any) -> None:
        # Before the consumer builds its strategies and tracers; this app's worker only.
        if getattr(sender, "app", None) is app and not task_log:
            for name in TASK_LOGGERS:
                logging.getLogger(name).setLevel(logging.WARNING)

    signals.worker_init.connect(quiet, weak=False)


def script_acks(app: Celery) -> Callable[[Any], BrokerAck | None]:
    """A member's message acknowledged by its report script (one round trip fewer than
    kombu's own ack after the task), when ``app``'s broker is kombu's Redis transport
    (ours) with its default unacked keys: the returned function gives a Celery request's
    delivery tag as a BrokerAck, or None (kombu acknowledges the message as usual). The
    configuration is read once, not per member."""
    conf = app.conf
    options = conf.broker_transport_options or {}
    if (
        conf.broker_transport != BROKER_TRANSPORT
        or options.get("global_keyprefix")
        or options.get("unacked_key") != keys.UNACKED_HASH
    ):
        return lambda _request: None

    def ack(request: Any) -> BrokerAck | None:
        tag = (getattr(request, "properties", None) or {}).get("delivery_tag")
        return BrokerAck(keys.BROKER_DB, str(tag)) if tag else None

    return ack


def run_member(runtime: WorkerRuntime, payload: Any, ack: BrokerAck | None) -> None:
    """A member task's body, for Celery's task and the member lane alike."""
    try:
        task = MemberTask.model_validate(payload)
    except ValidationError as exc:
        # A malformed payload cannot be answered (it may lack a group); it is
        # logged loudly and acknowledged so it does not loop through the queue.
        log.error("rejected member task payload: %s", exc)
        return
    execute_member(task, runtime.context(), ack)


def create_app(settings: HacoSettings, redis_url: str, member_lane: str | None = None) -> Celery:
    """HACO's Celery app; ``member_lane``: a zone queue whose members a worker of this
    app runs in the member lane (workers.lane) instead of through Celery's consumer."""
    app = Celery("haco", set_as_current=False)
    app.conf.update(celery_conf(settings, redis_url))
    quiet_task_logs(app, settings.worker_task_log)
    runtime = WorkerRuntime(
        settings,
        redis_url,
        lambda payload: app.send_task(JUDGE_TASK, args=[payload], queue=JUDGE_QUEUE),
    )

    ack_of = script_acks(app)

    # shared=False: the task belongs to this app only, never Celery's implicit registry.
    @app.task(name=MEMBER_TASK, ignore_result=True, acks_late=True, shared=False, bind=True)
    def member(self: Any, payload: dict[str, Any]) -> None:
        run_member(runtime, payload, ack_of(self.request))

    if member_lane is not None:
        lane_queue = member_lane

        def make_lane(threads: int, hostname: str) -> MemberLane:  # at the worker's start
            broker = redis.Redis.from_url(with_db(redis_url, keys.BROKER_DB))
            run = functools.partial(run_member, runtime)
            return MemberLane(broker, lane_queue, run, task_name=MEMBER_TASK, threads=threads,
                              poll_s=settings.member_lane_poll_s, hostname=hostname,
                              starts=LaneStarts(runtime.context))  # fmt: skip

        app.steps["worker"].add(lane_step(make_lane))

    @app.task(
        name=JUDGE_TASK,
        bind=True,
        ignore_result=True,
        acks_late=True,
        max_retries=None,
        shared=False,
    )
    def judge(self: Any, payload: dict[str, Any]) -> None:
        try:
            task = JudgeTask.model_validate(payload)
        except ValidationError as exc:
            log.error("rejected judge task payload: %s", exc)  # dropped, as for members
            return
        try:
            done = runtime.judge(task)
        except (DatabaseError, StoreError) as exc:
            _retry_judge(self, task, f"the trace store or Redis failed: {exc}")
            return
        except InputError as exc:  # a member row of another candidate, a bad config
            log.error("judge task for member %s dropped: %s", task.member_id, exc)
            return
        if done.outcome is Outcome.NOT_FOUND:
            _retry_judge(self, task, "its row is not in the trace store yet")
        elif done.outcome is Outcome.UNSCORED:
            log.warning("member %s not judged: %s", task.member_id, done.reason)
        else:
            log.info("member %s judged: %s %s", task.member_id, done.outcome.value, done.score)

    register_maintenance(app, settings, with_db(redis_url, keys.APP_DB))  # haco.recompute
    app.conf.haco_runtime = runtime
    return app


def _retry_judge(celery_task: Any, task: JudgeTask, why: str) -> None:
    """Retry with a doubling countdown; after JUDGE_MAX_RETRIES, drop with an ERROR."""
    n = int(celery_task.request.retries)
    if n >= JUDGE_MAX_RETRIES:
        log.error("judgement of member %s dropped after %d retries: %s", task.member_id, n, why)
        return
    log.info("judgement of member %s retried (%s)", task.member_id, why)
    raise celery_task.retry(countdown=min(JUDGE_RETRY_MAX_S, JUDGE_RETRY_FIRST_S * 2**n))
