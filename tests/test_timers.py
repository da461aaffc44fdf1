"""The process's shared timer thread (coordinator.runtime.timers)."""

from __future__ import annotations

import threading

from coordinator.runtime.group import Alarm
from coordinator.runtime.timers import Timers


def test_actions_run_in_due_order_and_cancelled_ones_never() -> None:
    timers = Timers()
    ran: list[str] = []
    done = threading.Event()

    def note(name: str) -> None:
        ran.append(name)
        if name == "last":
            done.set()

    timers.schedule(0.06, lambda: note("last"))
    timers.schedule(0.02, lambda: note("second"))
    timers.schedule(0.0, lambda: note("first"))
    timers.schedule(0.03, lambda: note("cancelled")).cancel()
    assert done.wait(10)
    assert ran == ["first", "second", "last"]


def test_one_thread_serves_every_alarm_and_survives_a_failing_action() -> None:
    timers = Timers()
    done = threading.Event()
    before = threading.active_count()

    def boom() -> None:
        raise RuntimeError("a push that failed")

    alarms = [Alarm(0.0, timers) for _ in range(20)]
    alarms[0].start(0.0, boom)
    for a in alarms[1:]:
        a.start(0.01, lambda: None)
    Alarm(0.0, timers).start(0.02, done.set)
    assert done.wait(10)  # still serving after the failure
    assert threading.active_count() <= before + 1  # one timer thread, not one per alarm
