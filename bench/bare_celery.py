"""The bare-Celery baseline of bench/runtime.py: one trivial task that LPUSHes a reply,
and one that sleeps first (the tail bench's draws) and says when it started and ended.

Same broker layout and worker settings as HACO's app (:func:`workers.app.create_app`):
Redis broker in DB 1, threads pool, the same concurrency, prefetch multiplier 1, late
acks, JSON, no result backend, Celery's per-task INFO lines off (``--task-log`` turns
them on, as HACO_WORKER_TASK_LOG does for HACO's workers). The reply goes on a Redis
list in DB 0 that the client BRPOPs, as a member's report does. What it leaves out is
HACO itself: no group state, no profiles, no traces, no pydantic models, and (unless
``--events``) no task events.

    python -m bench.bare_celery worker --url redis://127.0.0.1:6379/0 --concurrency 16
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

import redis
from celery import Celery

from coordinator.state import keys
from coordinator.state.broker import with_db
from workers.app import quiet_task_logs

QUEUE = "bench.bare"
TASK = "bench.bare.echo"
SLEEP_TASK = "bench.bare.sleep"

_clients: dict[str, redis.Redis] = {}
_lock = threading.Lock()


def reply_client(url: str) -> redis.Redis:
    """One Redis client (DB 0) per process, shared by the worker threads."""
    with _lock:
        if url not in _clients:
            _clients[url] = redis.Redis.from_url(with_db(url, keys.APP_DB))
        return _clients[url]


def create_bare_app(
    url: str, concurrency: int = 16, events: bool = False, task_log: bool = False
) -> Celery:
    app = Celery("bare", set_as_current=False)
    # Celery's per-task INFO lines as HACO's workers have them (off unless asked): the
    # two workers compare at the same log volume.
    quiet_task_logs(app, task_log)
    app.conf.update(
        broker_url=with_db(url, keys.BROKER_DB),
        broker_transport_options={"visibility_timeout": 3600.0},
        broker_connection_retry_on_startup=True,
        result_backend=None,
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_pool="threads",
        worker_concurrency=concurrency,
        worker_hijack_root_logger=False,
        task_serializer="json",
        accept_content=["json"],
        worker_send_task_events=events,
        task_send_sent_event=events,
    )

    @app.task(name=TASK, ignore_result=True, acks_late=True)  # type: ignore[untyped-decorator]
    def echo(reply_key: str, token: str) -> None:
        reply_client(url).lpush(reply_key, token)

    @app.task(name=SLEEP_TASK, ignore_result=True, acks_late=True)  # type: ignore[untyped-decorator]
    def sleep(reply_key: str, token: str, sleep_s: float) -> None:
        # Its own time as a member's trace has it (started, finished): what the caller's
        # round trip has on top of it is the runtime's.
        started = time.time()
        time.sleep(sleep_s)
        reply = json.dumps([token, started, time.time()])
        reply_client(url).lpush(reply_key, reply)

    return app


def send_echo(app: Celery, reply_key: str, token: str) -> Any:
    return app.send_task(TASK, args=[reply_key, token], queue=QUEUE)


def send_sleep(app: Celery, reply_key: str, token: str, sleep_s: float) -> Any:
    return app.send_task(SLEEP_TASK, args=[reply_key, token, sleep_s], queue=QUEUE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker", help="run the bare worker (same flags as `haco worker`)")
    w.add_argument("--url", required=True, help="redis:// URL of the server (any DB)")
    w.add_argument("--concurrency", type=int, default=16)
    w.add_argument("--events", action="store_true", help="send task events, as HACO does")
    w.add_argument(
        "--task-log", action="store_true", help="Celery's per-task INFO lines (HACO: off)"
    )
    w.add_argument("--loglevel", default="INFO", help="as `haco worker` (INFO)")
    args = parser.parse_args()
    app = create_bare_app(args.url, args.concurrency, args.events, args.task_log)
    argv = ["worker", "--queues", QUEUE, "--pool", "threads"]
    argv += ["--concurrency", str(args.concurrency), "--hostname", "bare@%h"]
    argv += ["--loglevel", args.loglevel, "--without-mingle", "--without-gossip"]
    app.worker_main(argv)


if __name__ == "__main__":
    main()
