"""A HACO worker leaves out Celery's per-task INFO lines unless worker_task_log is on
(workers.app.TASK_LOGGERS): Celery's worker_init signal, sent before the consumer builds
its strategies and tracers, sets their level, for that app's worker only."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from celery import signals

from coordinator.config import HacoSettings
from workers.app import TASK_LOGGERS, create_app


@pytest.fixture
def levels() -> Iterator[None]:
    before = {n: logging.getLogger(n).level for n in TASK_LOGGERS}
    yield
    for name, level in before.items():
        logging.getLogger(name).setLevel(level)


class _Worker:  # what worker_init sends: the WorkController, with its app
    def __init__(self, app: object) -> None:
        self.app = app


def _levels() -> set[int]:
    return {logging.getLogger(n).level for n in TASK_LOGGERS}


@pytest.mark.usefixtures("levels")
@pytest.mark.parametrize(("task_log", "level"), [(False, logging.WARNING), (True, logging.NOTSET)])
def test_the_per_task_lines_are_off_unless_asked(
    runtime_redis_url: str, task_log: bool, level: int
) -> None:
    for name in TASK_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)
    app = create_app(HacoSettings(worker_task_log=task_log), runtime_redis_url)
    signals.worker_init.send(sender=_Worker(None))
    assert _levels() == {logging.NOTSET}  # not this app's worker: nothing changes
    signals.worker_init.send(sender=_Worker(app))
    assert _levels() == {level}
    assert not logging.getLogger(TASK_LOGGERS[1]).isEnabledFor(logging.INFO) or task_log
