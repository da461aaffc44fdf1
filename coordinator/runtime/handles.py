"""Enqueue now, collect later: ``HacoClient.submit`` and ``HacoClient.handle``.

    handle = client.submit("coder", "plot the sales")   # returns at once
    handle.id                                            # the hedge group's id
    other_process_client.handle(handle.id).result(30)   # InvocationResult, or the HedgeError

:class:`Submitter` runs submitted invocations on a small per-client thread pool
(``submit_workers``): each is marked accepted ("pending") at submit, "running" when a
thread takes it, and its outcome (:mod:`coordinator.runtime.outcome`) is stored with a
done token that wakes every waiter in any process (keys.invocation_result, _done).
:class:`InvocationHandle` reads them through the :class:`OutcomeStore` port only, so it
works from any process pointed at the same Redis.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from coordinator.config import HacoSettings
from coordinator.errors import (
    HacoError,
    InputError,
    ResultPendingError,
    StoreError,
    UnknownInvocationError,
)
from coordinator.runtime.aio import Hubs
from coordinator.runtime.outcome import (
    PENDING,
    RUNNING,
    InvocationError,
    InvocationState,
    InvocationStatus,
    Outcome,
    decode,
    encode,
    status_of,
)
from coordinator.runtime.ports import OutcomeStore
from coordinator.runtime.results import InvocationResult
from coordinator.state.ids import hex_id
from schemas.models import RoleInvocation

log = logging.getLogger(__name__)

Run = Callable[[RoleInvocation, str], InvocationResult]  # Coordinator.invoke(inv, group_id)
_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def check_id(invocation_id: str) -> str:
    if not isinstance(invocation_id, str) or not _ID.fullmatch(invocation_id):
        raise InputError(
            f"invocation id {invocation_id!r} is not valid; expected 1-128 characters of "
            "letters, digits, '_', '.' or '-'"
        )
    return invocation_id


class InvocationHandle:
    """A submitted invocation, from any process: its status, and its outcome."""

    def __init__(
        self,
        invocation_id: str,
        store: OutcomeStore,
        settings: HacoSettings,
        hubs: Hubs | None = None,
    ) -> None:
        self.id = check_id(invocation_id)
        self.store = store
        self.settings = settings
        self.hubs = hubs  # aresult waits on the event loop's reply hub; None: on a thread

    def __repr__(self) -> str:
        return f"InvocationHandle({self.id!r})"

    def status(self) -> InvocationStatus:
        phase, raw = self.store.invocation_record(self.id)
        return status_of(self.id, phase, raw)

    def result(self, timeout_s: float | None = None) -> InvocationResult:
        """The InvocationResult, waiting up to ``timeout_s`` (None: as long as the
        invocation stays known); raises the HedgeError ``invoke`` would have raised,
        :class:`UnknownInvocationError` for an id no process accepted (or expired), and
        :class:`ResultPendingError` when the wait ends first."""
        if timeout_s is not None and not timeout_s >= 0:
            raise InputError(f"timeout_s={timeout_s!r} is not valid; expected a number >= 0")
        end = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = self.settings.result_recheck_s if end is None else end - time.monotonic()
            raw = self.store.wait_outcome(
                self.id, min(max(0.0, left), self.settings.result_recheck_s)
            )
            if raw is not None:
                return self._unwrap(decode(raw, self.id))
            state = self.status().state
            if state is InvocationState.DONE:
                continue  # stored just after the wait ended: read it
            self._check_waiting(state, timeout_s, end is not None and time.monotonic() >= end)

    async def aresult(self, timeout_s: float | None = None) -> InvocationResult:
        """:meth:`result` from async code: the wait is on the event loop's reply hub (no
        thread, no connection of its own), or on a thread without a hub."""
        if self.hubs is None:
            return await asyncio.to_thread(self.result, timeout_s)
        if timeout_s is not None and not timeout_s >= 0:
            raise InputError(f"timeout_s={timeout_s!r} is not valid; expected a number >= 0")
        hub = self.hubs.current()
        loop = asyncio.get_running_loop()
        end = None if timeout_s is None else loop.time() + timeout_s
        recheck = self.settings.result_recheck_s
        while True:
            status = self.status()  # one short MGET on the loop
            if status.state is InvocationState.DONE:
                return self._unwrap(Outcome(result=status.result, error=status.error))
            self._check_waiting(status.state, timeout_s, end is not None and loop.time() >= end)
            left = recheck if end is None else min(recheck, end - loop.time())
            await hub.wait_done(self.id, max(0.0, left))

    def _check_waiting(self, state: InvocationState, timeout_s: float | None, late: bool) -> None:
        if state is InvocationState.UNKNOWN:
            raise UnknownInvocationError(
                f"unknown invocation {self.id!r}: never submitted, or its record "
                f"expired (result_ttl_s={self.settings.result_ttl_s})"
            )
        if late:
            raise ResultPendingError(
                f"invocation {self.id!r} is still {state.value} after timeout_s={timeout_s}"
            )

    def _unwrap(self, out: Outcome) -> InvocationResult:
        if out.result is not None:
            return out.result
        assert out.error is not None  # decode() guarantees exactly one
        raise out.error.exception()


class Submitter:
    """Runs submitted invocations in the background and stores their outcomes."""

    def __init__(
        self,
        store: OutcomeStore,
        run: Run,
        settings: HacoSettings,
        new_id: Callable[[], str] = hex_id,  # a group's id, as Coordinator draws it
        hubs: Hubs | None = None,
    ) -> None:
        self.hubs = hubs  # given to the handles it returns (their aresult)
        self.store = store
        self.run = run
        self.settings = settings
        self.new_id = new_id
        self._pool = ThreadPoolExecutor(settings.submit_workers, thread_name_prefix="haco-submit")
        self._closed = threading.Event()

    def _ttl(self, inv: RoleInvocation) -> float:
        """An accepted record outlives the invocation's deadline by result_ttl_s."""
        return (inv.deadline_s or self.settings.default_deadline_s) + self.settings.result_ttl_s

    def submit(self, inv: RoleInvocation) -> InvocationHandle:
        if self._closed.is_set():
            raise InputError("submit on a closed HacoClient; open a new client")
        gid = self.new_id()
        self.store.set_invocation_phase(gid, PENDING, self._ttl(inv))
        self._pool.submit(self._run, inv, gid)
        return InvocationHandle(gid, self.store, self.settings, self.hubs)

    def _run(self, inv: RoleInvocation, gid: str) -> None:
        try:
            self.store.set_invocation_phase(gid, RUNNING, self._ttl(inv))
            out = Outcome(result=self.run(inv, gid))
        except Exception as exc:  # every failure becomes the stored outcome
            if not isinstance(exc, HacoError):  # a bug, not an outcome of the method
                log.exception("invocation %s failed unexpectedly", gid)
            out = Outcome(error=InvocationError.of(exc, gid))
        try:
            self.store.save_outcome(gid, encode(out), self.settings.result_ttl_s)
        except StoreError:
            log.exception("the outcome of invocation %s could not be stored", gid)

    def close(self) -> None:
        """Refuse new submissions; wait for the accepted ones to finish and be stored."""
        self._closed.set()
        self._pool.shutdown(wait=True)
