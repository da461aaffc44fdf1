"""A member's start token, sent only if the member is still running after
``started_notice_delay_s`` (HacoSettings): a member that reports sooner says it started
with its report (coordinator.runtime.coordinator takes the start from the trace), which
spares its coordinator a wake-up and a round trip. The token goes out on the process's
timer thread for coarse timers (coordinator.runtime.timers, 10 ms ticks), never
after the member finished."""

from __future__ import annotations

import logging
import threading

from coordinator.errors import StoreError
from coordinator.runtime.ports import RuntimeStore
from coordinator.runtime.timers import COARSE_TIMERS, Handle, Timers

log = logging.getLogger(__name__)


class StartNotice:
    def __init__(
        self,
        store: RuntimeStore,
        group_id: str,
        token: str,
        ttl_s: float,
        delay_s: float,
        timers: Timers = COARSE_TIMERS,
    ) -> None:
        self.store, self.group_id, self.token, self.ttl_s = store, group_id, token, ttl_s
        self._lock = threading.Lock()
        self._done = False
        self._handle: Handle = timers.schedule(delay_s, self._send)

    def _send(self) -> None:
        # Under the lock: the member's report cannot overtake its own start token.
        with self._lock:
            if self._done:
                return
            self._done = True
            try:
                self.store.push_reply(self.group_id, self.token, self.ttl_s)
            except StoreError:  # its report (or the start timeout) still tells
                log.warning("group %s: a start token could not be sent", self.group_id)

    def finish(self) -> None:
        """The member is done: no token after this (one being sent completes first)."""
        with self._lock:
            self._done = True
        self._handle.cancel()
