"""Runtime commands of `haco`: worker, up, status, invoke."""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from coordinator.cli.common import clean_errors, err, show
from coordinator.config import HacoSettings
from coordinator.errors import ConfigError, InputError, ServiceError
from coordinator.state.keys import JUDGE_QUEUE, lane_queue, queue_for
from schemas.enums import LaunchMode, WinnerMode

if TYPE_CHECKING:
    from coordinator.runtime.coordinator import InvocationResult


def _worker_queue(settings: HacoSettings, zone: str | None, judge: bool) -> tuple[str, str]:
    """The queue a worker consumes and its node name's prefix."""
    from coordinator.runtime.dispatch import node_prefix
    from coordinator.runtime.pool import Pool, pool_from_settings
    from coordinator.services.embedded_pg import trace_store_url

    pool = Pool(pool_from_settings(settings))
    if judge == (zone is not None):
        raise InputError("give either --zone ZONE (a zone's members) or --judge (the judge)")
    if zone is None:
        if pool.config.evaluator is None:
            raise ConfigError("--judge: the pool config defines no evaluator to score with")
        trace_store_url(settings)  # the judge writes to the trace store: fail now if none
        return JUDGE_QUEUE, node_prefix("judge")
    return queue_for(pool.check_zone(zone)), node_prefix(zone)


def _wait_workers(
    settings: HacoSettings,
    redis_url: str,
    zones: list[str],
    stop: threading.Event,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Until the worker of every zone answers a Celery ping (or up_ready_timeout_s, or
    Ctrl-C): then an invocation right after `haco up` finds every queue consumed."""
    import socket

    from coordinator.runtime.dispatch import await_answers, sending_app, worker_node
    from coordinator.services.supervisor import JUDGE_WORKER

    host = socket.gethostname()
    want = {worker_node(z, host): z for z in zones if z != JUDGE_WORKER}
    app = sending_app(settings, redis_url)
    try:
        deadline = clock() + settings.up_ready_timeout_s
        seen = await_answers(app, want, deadline, clock, stop)
    finally:
        app.close()
    if want.keys() <= seen:
        err.print(f"workers ready: {len(want)} zone(s) answer")
    elif not stop.is_set():
        late = sorted(z for w, z in want.items() if w not in seen)
        err.print(
            f"warning: no answer yet from the worker of zone(s) {late} after "
            f"{settings.up_ready_timeout_s:g} s; see the logs in the state dir"
        )


@clean_errors
def worker_cmd(
    zone: Annotated[
        str | None, typer.Option(help="The zone whose queue this worker consumes")
    ] = None,
    judge: Annotated[
        bool, typer.Option("--judge", help=f"Consume the judge queue ({JUDGE_QUEUE}) instead")
    ] = False,
    concurrency: Annotated[int | None, typer.Option(help="Threads (default: settings)")] = None,
) -> None:
    """Run a Celery worker for one zone, or for the judge (threads pool; LLM calls are I/O)."""
    from coordinator.runtime.client import service_url
    from workers.app import create_app

    settings = HacoSettings()
    queue, name = _worker_queue(settings, zone, judge)
    if concurrency is not None and concurrency < 1:
        raise InputError(f"--concurrency={concurrency}; expected at least 1")
    lane = zone is not None and settings.member_lane
    if lane and settings.task_events:
        err.print("member_lane is not used: task_events is on (lane members send no task "
                  "events for Flower); members go through Celery's consumer")  # fmt: skip
        lane = False
    app = create_app(settings, service_url(settings), member_lane=queue if lane else None)
    app.worker_main(
        [
            "worker",
            "--queues",
            lane_queue(str(zone)) if lane else queue,
            "--pool",
            "threads",
            "--concurrency",
            str(
                concurrency
                or (settings.judge_concurrency if judge else settings.worker_concurrency)
            ),
            "--hostname",
            f"{name}@%h",
            "--loglevel",
            "INFO",
            "--without-mingle",
            "--without-gossip",
        ]
    )


@clean_errors
def up_cmd(
    concurrency: Annotated[int | None, typer.Option(help="Threads per worker")] = None,
    flower: Annotated[
        bool, typer.Option("--flower", help="Also run Celery Flower (127.0.0.1 only)")
    ] = False,
    flower_port: Annotated[
        int, typer.Option(help="Flower's port (with --flower)", min=1, max=65_535)
    ] = 5555,
) -> None:
    """Start the services (embedded when HACO_*_URL is unset) and one worker per zone of
    the pool, and keep them running: a process that dies is restarted with backoff
    (`haco status` shows them); Ctrl-C stops everything it started, workers before
    servers."""
    from coordinator.runtime.pool import Pool, pool_from_settings
    from coordinator.services.restart import RestartPolicy
    from coordinator.services.supervisor import start_stack, stop_on_signal
    from coordinator.services.watchdog import Supervisor, live_supervisor
    from coordinator.tracestore.db import redact

    settings = HacoSettings()
    state_dir = settings.state_dir.absolute()
    running = live_supervisor(state_dir)
    if running is not None:
        raise ServiceError(
            f"`haco up` already runs for state dir {str(state_dir)!r} (pid {running}); "
            "stop it first, or set HACO_STATE_DIR to run another"
        )
    pool = Pool(pool_from_settings(settings))
    # Signals first: a Ctrl-C while the stack starts still stops what has started.
    stop, restore = stop_on_signal()
    try:
        stack = start_stack(
            settings,
            sorted(pool.zones),
            concurrency,
            with_store=True,
            flower_port=flower_port if flower else None,
        )
    except BaseException:
        restore()
        raise
    say = functools.partial(err.print, markup=False, highlight=False, soft_wrap=True)
    supervisor = Supervisor(stack, RestartPolicy.from_settings(settings), state_dir, say=say)
    try:
        embedded = " (embedded)" if stack.embedded else ""
        err.print(f"state dir {state_dir}")
        err.print(f"redis {redact(stack.redis_url)}{embedded}")
        if stack.database_url:
            pg = " (embedded)" if stack.embedded_pg else ""
            err.print(f"postgres {redact(stack.database_url)}{pg}: migrated; harvester, beat")
        for zone, proc in stack.workers.items():
            err.print(f"worker {zone}: pid {proc.pid}, queue {queue_for(zone)}")
        if stack.flower_url:
            err.print(f"flower {stack.flower_url} (task events on)")
        _wait_workers(settings, stack.redis_url, sorted(stack.workers), stop)
        err.print(f"logs in {stack.log_dir}; supervised; Ctrl-C to stop")
        if not stop.is_set():
            supervisor.run(stop, settings.supervise_poll_s)
    finally:
        supervisor.stopping = True
        err.print("stopping workers, then services")
        try:
            stack.stop()
        finally:
            supervisor.remove_status()
            restore()


def _redis_answers(url: str) -> bool:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    try:
        client = redis.Redis.from_url(
            url, socket_timeout=1.0, socket_connect_timeout=1.0, retry=Retry(NoBackoff(), 0)
        )
        with client:
            return bool(client.ping())
    except (redis.RedisError, OSError, ValueError):
        return False


def _pg_answers(url: str) -> bool:
    from coordinator.errors import DatabaseError
    from coordinator.tracestore.db import connect

    try:
        with connect(url, timeout_s=2):
            return True
    except DatabaseError:
        return False


def services_status(settings: HacoSettings) -> dict[str, Any]:
    """What runs where for ``settings`` (`haco status`): the state dir, Redis and
    Postgres (configured or embedded, and whether they answer), the supervisor of
    `haco up` and its processes (``<state_dir>/supervisor.json``), Flower."""
    from coordinator.services import embedded_pg, embedded_redis
    from coordinator.services.watchdog import pid_alive, read_status, status_path
    from coordinator.tracestore.db import redact

    state_dir = settings.state_dir.absolute()
    redis_url = settings.redis_url or embedded_redis.discover(state_dir)
    pg_url = settings.database_url or embedded_pg.discover(state_dir)
    sup = read_status(state_dir)
    sup_pid = None if sup is None else sup.get("supervisor_pid")
    sup_alive = pid_alive(sup_pid)
    services = (sup or {}).get("services") or {}
    flower = services.get("flower") if sup_alive else None
    processes = (sup or {}).get("processes") or {}
    return {
        "state_dir": str(state_dir),
        "redis": None
        if redis_url is None
        else {
            "url": redact(redis_url),
            "embedded": not settings.redis_url,
            "answers": _redis_answers(redis_url),
        },
        "postgres": None
        if pg_url is None
        else {
            "url": redact(pg_url),
            "embedded": not settings.database_url,
            "answers": _pg_answers(pg_url),
        },
        "supervisor": None
        if sup is None
        else {
            "pid": sup_pid,
            "running": sup_alive,
            "state": sup.get("state") if sup_alive else "gone (stale status file)",
            "file": str(status_path(state_dir)),
            "updated_at": sup.get("updated_at"),
        },
        "flower": None if not isinstance(flower, dict) else flower.get("url"),
        "processes": processes if isinstance(processes, dict) else {},
    }


def status_table(found: dict[str, Any]) -> Table:
    t = Table(title=f"HACO services, state dir {found['state_dir']}")
    for col in ("what", "where", "pid", "alive", "restarts", "last exit"):
        t.add_column(col)
    for name in ("redis", "postgres"):
        svc = found[name]
        if svc is None:
            t.add_row(name, "not found", "", "", "", "")
            continue
        kind = "embedded" if svc["embedded"] else "external"
        t.add_row(name, f"{svc['url']} ({kind})", "", "yes" if svc["answers"] else "NO", "", "")
    sup = found["supervisor"]
    if sup is not None:
        t.add_row("haco up", sup["file"], str(sup["pid"]), "yes" if sup["running"] else "NO",
                  "", sup["state"])  # fmt: skip
    if found["flower"]:
        t.add_row("flower", found["flower"], "", "", "", "")
    for name, p in sorted(found["processes"].items()):
        if not isinstance(p, dict):
            continue
        alive = "yes" if p.get("alive") else str(p.get("state") or "no")
        t.add_row(
            f"  {name}",
            str(p.get("kind") or ""),
            str(p.get("pid") or ""),
            alive,
            str(p.get("restarts", 0)),
            str(p.get("last_exit_reason") or ""),
        )
    return t


@clean_errors
def status_cmd() -> None:
    """Say what runs where: the state dir, Redis and Postgres (embedded or external, and
    whether they answer), the processes `haco up` supervises, Flower. Exit 1 if no
    services are found."""
    settings = HacoSettings()
    found = services_status(settings)
    show(status_table(found))
    print(json.dumps(found, indent=2))
    redis_ok = found["redis"] is not None and found["redis"]["answers"]
    sup_ok = found["supervisor"] is not None and found["supervisor"]["running"]
    if not (redis_ok or sup_ok):
        raise ServiceError(
            f"no HACO services: no Redis answers (HACO_REDIS_URL unset and no embedded "
            f"server under {found['state_dir']!r}) and no `haco up` runs there; "
            "start them with `haco up`"
        )


def result_table(res: InvocationResult) -> Table:
    t = Table(
        title=f"group {res.group_id}: {res.state.value}, winner {res.winner_id} "
        f"({res.zone}), P_succ={res.p_success:.3f}, {res.latency_s * 1000:.1f} ms"
    )
    if res.fallback_reason and res.winner_rule is not None:
        t.caption = f"winner rule {res.winner_rule.value}: {res.fallback_reason}"
    for col in ("rank", "member", "candidate", "zone", "status", "latency ms", "tokens", "reason"):
        t.add_column(col)
    for m in res.members:
        lat = "" if m.latency_s is None else f"{m.latency_s * 1000:.1f}"
        t.add_row(
            str(m.rank),
            m.member_id,
            m.candidate_id,
            m.zone,
            m.status.value,
            lat,
            str(m.tokens_in + m.tokens_out),
            m.reason or "",
        )
    return t


@clean_errors
def invoke_cmd(
    role: Annotated[str, typer.Option(help="The role to invoke")],
    message: Annotated[str, typer.Option(help="The user message")],
    tau: Annotated[float | None, typer.Option(help="Target reliability τ")] = None,
    deadline_s: Annotated[float | None, typer.Option(help="Group deadline (s)")] = None,
    launch_mode: Annotated[LaunchMode | None, typer.Option(help="parallel or staggered")] = None,
    winner_mode: Annotated[WinnerMode | None, typer.Option(help="ranked, first or best")] = None,
    not_idempotent: Annotated[bool, typer.Option(help="The call has side effects")] = False,
    idempotency_key: Annotated[str | None, typer.Option(help="Commit side effects once")] = None,
    require_hedge: Annotated[bool, typer.Option(help="Reject rather than narrow")] = False,
) -> None:
    """Invoke a role through the running services and print the hedge group's outcome."""
    from coordinator.runtime.client import HacoClient

    with HacoClient() as client:
        res = client.invoke(
            role,
            message,
            tau=tau,
            deadline_s=deadline_s,
            launch_mode=launch_mode,
            winner_mode=winner_mode,
            idempotent=not not_idempotent,
            idempotency_key=idempotency_key,
            require_hedge=require_hedge,
        )
    show(result_table(res))
    print(json.dumps(asdict(res), default=str, indent=2))


def register_ops(app: typer.Typer) -> None:
    app.command("worker")(worker_cmd)
    app.command("up")(up_cmd)
    app.command("status")(status_cmd)
    app.command("invoke")(invoke_cmd)
