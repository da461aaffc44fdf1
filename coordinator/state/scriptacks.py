"""Delivery tags whose Celery message a member's report script acknowledged.

The script removes the message from kombu's unacked hash and index in the same atomic
step as the report (:mod:`coordinator.state.memberops`); kombu's own ack of such a tag,
which comes after the task returns, then only does its in-memory bookkeeping
(:mod:`coordinator.state.kombu_redis`). Kept apart from both so that the store does not
import kombu.
"""

from __future__ import annotations

import threading


class ScriptAcks:
    """Delivery tags a member's report script already acknowledged (it removes the
    message from kombu's unacked hash and index in the same atomic step as the report:
    coordinator.state.memberops). kombu's ack of such a tag, which comes after the task
    returns, only does its in-memory bookkeeping."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tags: set[str] = set()

    def add(self, tag: str) -> None:
        with self._lock:
            self._tags.add(tag)

    def take(self, tag: str) -> bool:
        """Whether ``tag`` was acknowledged by a script (forgotten from now on)."""
        with self._lock:
            if tag in self._tags:
                self._tags.discard(tag)
                return True
            return False


SCRIPT_ACKS = ScriptAcks()  # one per worker process: its consumer's channels share it
