"""Runtime commands of `haco`: worker, up, invoke."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from coordinator.cli.common import clean_errors, err, show
from coordinator.config import HacoSettings
from coordinator.errors import ConfigError, InputError
from coordinator.state.keys import JUDGE_QUEUE, queue_for
from schemas.enums import LaunchMode, WinnerMode

if TYPE_CHECKING:
    from coordinator.runtime.coordinator import InvocationResult


def _worker_queue(settings: HacoSettings, zone: str | None, judge: bool) -> tuple[str, str]:
    """The queue a worker consumes and its node name's prefix."""
    from coordinator.runtime.pool import Pool, pool_from_settings
    from coordinator.services.embedded_pg import trace_store_url

    pool = Pool(pool_from_settings(settings))
    if judge == (zone is not None):
        raise InputError("give either --zone ZONE (a zone's members) or --judge (the judge)")
    if zone is None:
        if pool.config.evaluator is None:
            raise ConfigError("--judge: the pool config defines no evaluator to score with")
        trace_store_url(settings)  # the judge writes to the trace store: fail now if none
        return JUDGE_QUEUE, "haco-judge"
    return queue_for(pool.check_zone(zone)), f"haco-{zone}"


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
    app = create_app(settings, service_url(settings))
    app.worker_main(
        [
            "worker",
            "--queues",
            queue,
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
) -> None:
    """Start the services (embedded when HACO_*_URL is unset) and one worker per zone of
    the pool; Ctrl-C stops everything it started, workers before servers."""
    from coordinator.runtime.pool import Pool, pool_from_settings
    from coordinator.services.supervisor import start_stack, wait_for_signal
    from coordinator.tracestore.db import redact

    settings = HacoSettings()
    pool = Pool(pool_from_settings(settings))
    stack = start_stack(settings, sorted(pool.zones), concurrency, with_store=True)
    try:
        embedded = " (embedded)" if stack.embedded else ""
        err.print(f"redis {stack.redis_url}{embedded}")
        if stack.database_url:
            pg = " (embedded)" if stack.embedded_pg else ""
            err.print(f"postgres {redact(stack.database_url)}{pg}: migrated; harvester, beat")
        for zone, proc in stack.workers.items():
            err.print(f"worker {zone}: pid {proc.pid}, queue {queue_for(zone)}")
        err.print(f"logs in {stack.log_dir}; Ctrl-C to stop")
        wait_for_signal()
    finally:
        err.print("stopping workers, then services")
        stack.stop()


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
    app.command("invoke")(invoke_cmd)
