"""What a submitted invocation leaves for any process to collect: its phase and its
outcome (the InvocationResult, or the error with every member's reason), as JSON.

The store keeps strings (:class:`coordinator.runtime.ports.OutcomeStore`); this module
gives them their meaning, and rebuilds the same :class:`coordinator.errors.HedgeError`
subclass ``invoke`` would have raised.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, TypeAdapter

from coordinator import errors
from coordinator.errors import (
    AllFailedError,
    DeadlineError,
    HacoError,
    HedgeError,
    StoreError,
    WinnerConflictError,
)
from coordinator.runtime.results import InvocationResult

PENDING, RUNNING = "pending", "running"  # the phases in keys.invocation_accepted


class InvocationState(StrEnum):
    PENDING = "pending"  # accepted, waiting for a free submit worker
    RUNNING = "running"  # its coordinator runs it
    DONE = "done"  # the outcome is stored: a result or an error
    UNKNOWN = "unknown"  # never accepted, or its record expired (result_ttl_s)


class InvocationError(BaseModel):
    """A failed invocation: the error's class name in :mod:`coordinator.errors`, its
    message, and what the class carries (every member's reason, the deadline, the
    winner claims of a conflict)."""

    model_config = ConfigDict(frozen=True)

    kind: str
    message: str
    group_id: str | None = None
    failures: dict[str, str] = {}
    deadline_s: float | None = None
    winner: str | None = None
    holder: str | None = None

    @classmethod
    def of(cls, exc: Exception, group_id: str) -> InvocationError:
        if not isinstance(exc, HacoError):
            return cls(kind="HacoError", message=f"{type(exc).__name__}: {exc}", group_id=group_id)
        return cls(
            kind=type(exc).__name__,
            message=str(exc),
            group_id=getattr(exc, "group_id", None) or group_id,
            failures=dict(getattr(exc, "failures", {})),
            deadline_s=getattr(exc, "deadline_s", None),
            winner=getattr(exc, "winner", None),
            holder=getattr(exc, "holder", None),
        )

    def exception(self) -> HacoError:
        """The error ``invoke`` raised, rebuilt: the same class, message and fields."""
        gid = self.group_id or ""
        if self.kind == AllFailedError.__name__:
            return AllFailedError(gid, dict(self.failures))
        if self.kind == DeadlineError.__name__ and self.deadline_s is not None:
            return DeadlineError(gid, self.deadline_s, dict(self.failures))
        if self.kind == WinnerConflictError.__name__:
            return WinnerConflictError(gid, self.winner, self.holder)
        cls = getattr(errors, self.kind, None)
        if isinstance(cls, type) and issubclass(cls, HedgeError):
            return cls(self.message, self.group_id)
        if isinstance(cls, type) and issubclass(cls, HacoError):
            return cls(self.message)
        return HacoError(self.message)


class Outcome(BaseModel):
    """The stored outcome (keys.invocation_result): exactly one of the two is set."""

    result: InvocationResult | None = None
    error: InvocationError | None = None


class InvocationStatus(BaseModel):
    """What ``InvocationHandle.status()`` answers; ``result``/``error`` once done."""

    invocation_id: str
    state: InvocationState
    result: InvocationResult | None = None
    error: InvocationError | None = None


_OUTCOME = TypeAdapter(Outcome)


def encode(outcome: Outcome) -> str:
    return outcome.model_dump_json()


def decode(raw: str, invocation_id: str) -> Outcome:
    try:
        out = _OUTCOME.validate_json(raw)
    except ValueError as exc:
        raise StoreError(
            f"the stored outcome of invocation {invocation_id!r} is not valid"
        ) from exc
    if (out.result is None) == (out.error is None):
        raise StoreError(
            f"the stored outcome of invocation {invocation_id!r} has "
            f"{'both' if out.result else 'neither'} a result and an error"
        )
    return out


def status_of(invocation_id: str, phase: str | None, raw: str | None) -> InvocationStatus:
    """The status from the stored (phase, outcome JSON) pair."""
    if raw is not None:
        out = decode(raw, invocation_id)
        return InvocationStatus(
            invocation_id=invocation_id,
            state=InvocationState.DONE,
            result=out.result,
            error=out.error,
        )
    if phase in (PENDING, RUNNING):
        return InvocationStatus(invocation_id=invocation_id, state=InvocationState(phase))
    return InvocationStatus(invocation_id=invocation_id, state=InvocationState.UNKNOWN)
