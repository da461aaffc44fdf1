"""Celery Flower for `haco up --flower`: the web monitor of HACO's workers and member tasks.

:func:`flower_argv` is the command (``python -m celery --broker URL flower``): Flower
connects to HACO's broker (database :data:`coordinator.state.keys.BROKER_DB` of HACO's
Redis, whatever database the URL given names) and listens on ``address``, loopback by
default: Flower has no authentication of its own here, and its API can shut workers down.
It shows task events only from workers that send them: `haco up --flower` starts its
workers with ``HACO_TASK_EVENTS=true`` (``worker_send_task_events`` and
``task_send_sent_event`` in :func:`coordinator.state.broker.celery_conf`).
"""

from __future__ import annotations

import sys

from coordinator.state import keys
from coordinator.state.broker import with_db

DEFAULT_PORT = 5555  # Flower's own default
LOOPBACK = "127.0.0.1"


def flower_argv(broker_url: str, port: int, address: str = LOOPBACK) -> list[str]:
    """The command that runs Flower on ``address:port`` for HACO's Celery broker on the
    Redis server of ``broker_url`` (its database number is replaced by the broker's)."""
    broker = with_db(broker_url, keys.BROKER_DB)
    return [
        sys.executable, "-m", "celery", "--broker", broker, "flower",
        f"--address={address}", f"--port={port}",
    ]  # fmt: skip


def flower_url(port: int, address: str = LOOPBACK) -> str:
    return f"http://{address}:{port}/"
