"""The lost-member records' deferral thread (coordinator.runtime.liveness.Deferred): a
failing record is logged, unless the coordinator closed while it ran (its client was
closed under it), when it is dropped as the pending ones are."""

from __future__ import annotations

import logging
import threading

from coordinator.runtime.liveness import Deferred

LOGGER = "coordinator.runtime.liveness"


class Noted(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _failing_record(close_in_action: bool) -> list[str]:
    """One due record that raises; whether the coordinator closes while it runs. The
    thread's own end (after its close) is waited for, so its log is complete."""
    d = Deferred(clock=lambda: 100.0)
    failed = threading.Event()

    def action() -> None:
        if close_in_action:
            d.close()  # the client closes while the record runs
        failed.set()
        raise ConnectionError("the connection was closed")

    noted, log = Noted(), logging.getLogger(LOGGER)
    log.addHandler(noted)
    try:
        d.at(99.0, action)  # due already
        assert failed.wait(10.0)
        if not close_in_action:
            d.at(99.0, d.close)  # the next record closes it: after the first was handled
        assert d._thread is not None
        d._thread.join(10.0)
        assert not d._thread.is_alive()
    finally:
        log.removeHandler(noted)
    return noted.messages


def test_a_failing_record_is_logged() -> None:
    assert _failing_record(close_in_action=False) == ["a deferred record of a lost member failed"]


def test_a_record_the_close_overtook_is_dropped_quietly() -> None:
    assert _failing_record(close_in_action=True) == []


def test_actions_run_in_due_order_whatever_order_they_came_in() -> None:
    """The thread is woken only by an action due before the one it waits for: the others
    still run, in due order, once due."""
    now = [0.0]
    d = Deferred(clock=lambda: now[0])
    ran: list[str] = []
    done = threading.Event()
    try:
        d.at(30.0, lambda: ran.append("third"))  # starts the thread, which waits for it
        d.at(40.0, done.set)
        d.at(10.0, lambda: ran.append("first"))  # before the head: the thread is woken
        d.at(20.0, lambda: ran.append("second"))  # after the head: it is not
        assert d.pending() == 4 and ran == []  # none due yet
        now[0] = 50.0
        assert done.wait(10.0)
        assert ran == ["first", "second", "third"] and d.pending() == 0
    finally:
        d.close()
