"""What a backend returns and the interface every backend implements."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from coordinator.core.profiles import LinkObservation
from schemas.enums import FailureKind
from schemas.models import MemberTask

StopCheck = Callable[[], bool]
"""Returns True when the member must stop (its group was cancelled). Backends call it
between slices of work: a simulated backend between sleep slices, an HTTP backend
between streamed chunks, closing the connection when it says stop."""


@runtime_checkable
class WaitableStop(Protocol):
    """A stop check a backend can also sleep on: ``wait(timeout_s)`` returns True as soon
    as the member must stop (the cancel watcher's :class:`coordinator.state.cancelwatch.
    Watch`), so a waiting backend needs no polling slices."""

    def __call__(self) -> bool: ...
    def wait(self, timeout_s: float) -> bool: ...


@dataclass(frozen=True, slots=True)
class BackendResult:
    failure: FailureKind | None  # None = success
    reason: str | None = None
    output: str | None = None
    quality: float | None = None  # judged quality, when the backend can judge (simulation)
    tokens_in: int = 0
    tokens_out: int = 0
    proc_latency_s: float | None = None
    bytes_sent: int = 0
    rtt_s: float | None = None
    bandwidth_Bps: float | None = None
    lost: bool = False
    delivered: bool = True  # False when the request never reached the service
    link_observations: list[LinkObservation] = field(default_factory=list)
    # Rate limited (HTTP 429): the candidate should not be planned for this many seconds
    # (workers.member sets its cooldown, keys.cooldown).
    retry_after_s: float | None = None


DeltaSink = Callable[[list[str]], None]
"""Takes the content deltas of one read, in order (workers.streamsink.ChunkSink)."""


@runtime_checkable
class DeltaBackend(Protocol):
    """A backend that can hand its content deltas over as they arrive."""

    def call_streamed(
        self, task: MemberTask, should_stop: StopCheck, sink: DeltaSink
    ) -> BackendResult: ...


class Backend(Protocol):
    def call(self, task: MemberTask, should_stop: StopCheck) -> BackendResult: ...

    def commit(self, task: MemberTask) -> None:
        """Perform the call's side effect; called once per idempotency key."""
        ...
