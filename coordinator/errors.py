"""Every error HACO raises on purpose derives from :class:`HacoError`.

::

    HacoError
    ├── InputError              bad input at a boundary (API, CLI, files, payloads)
    │   ├── ScenarioError       a scenario or pool file that does not describe a valid world
    │   ├── PlanInputError      a `haco plan` request that cannot be planned
    │   ├── ConfigError         a pool config that is not valid
    │   ├── UnknownRoleError    a role that the pool config does not serve
    │   ├── UnknownZoneError    a zone that the pool config does not define
    │   ├── UnknownInvocationError  an invocation id no process accepted (or expired)
    │   └── ScoreError          a scorer gave no usable score for a member's output
    ├── PolicyError             a rule of the method (allocation, launch, winner) was asked
    │                           something it cannot answer
    ├── StoreError              a shared-state backend (Redis) failed
    ├── ServiceError            an embedded service (Redis) cannot be started or stopped
    ├── ResultPendingError      a submitted invocation had no outcome within the wait
    ├── DatabaseError           the trace store (Postgres, external or embedded) failed
    │   └── MigrationError      a schema migration cannot be planned or applied
    └── HedgeError              an invocation ended without a result
        ├── AllFailedError      every member failed; ``failures`` has each one's reason
        ├── DeadlineError       the deadline passed before any member succeeded
        ├── NotIdempotentError  hedging was demanded for a call with side effects
        └── WinnerConflictError the group was closed first by another process, with
                                another outcome (its winner claim held)

Messages name the bad value and what was expected, so the CLI can print them as they are
and exit with status 2.
"""

from __future__ import annotations


class HacoError(Exception):
    """Base of every deliberate HACO error."""


class InputError(HacoError, ValueError):
    """Input that fails validation at a boundary."""


class ScenarioError(InputError):
    """A scenario file that does not describe a valid simulated world."""


class PlanInputError(InputError):
    """A `haco plan` request that cannot be planned."""


class ConfigError(InputError):
    """A pool config that is not valid."""


class UnknownRoleError(InputError):
    """A role the pool config does not serve."""


class UnknownZoneError(InputError):
    """A zone the pool config does not define (never an orphan queue)."""


class UnknownInvocationError(InputError):
    """An invocation id (HacoClient.handle) that no process accepted, or whose record
    expired (result_ttl_s)."""


class ScoreError(InputError):
    """A scorer gave no usable score (an unparseable evaluator answer, a value outside
    [0, 1], a failed evaluator call). The judge logs and counts the reason and applies
    nothing."""


class PolicyError(HacoError):
    """A rule of the method (the allocation rule, the launcher, the winner rule) was called
    with arguments it cannot decide on, e.g. a hedge group of no members."""


class StoreError(HacoError):
    """A shared-state backend failed (connection, timeout, script or data error); raised
    at the boundary with ``raise StoreError(...) from exc``."""


class ResultPendingError(HacoError, TimeoutError):
    """A submitted invocation had no outcome within the caller's wait; it may still end
    (collect it again with its handle)."""


class ServiceError(HacoError):
    """An embedded service (the valkey-server HACO runs when no Redis is configured) cannot
    be started, found or stopped; raised ``from`` the OSError, subprocess or redis error,
    with a message naming what failed (binary, port, state dir)."""


class DatabaseError(HacoError):
    """The trace store failed: Postgres cannot be reached, the embedded server cannot be
    started or stopped, or a query failed; raised ``from`` the psycopg, OSError or
    subprocess error, with a message naming what failed (database, data dir, log)."""


class MigrationError(DatabaseError):
    """A schema migration cannot be planned or applied: the database is newer than the
    migrations this HACO knows, an applied migration's file changed, or one failed."""


class HedgeError(HacoError):
    """An invocation ended without a result. ``group_id`` names the hedge group."""

    def __init__(self, message: str, group_id: str | None = None) -> None:
        super().__init__(message)
        self.group_id = group_id


class AllFailedError(HedgeError):
    """Every member failed. ``failures`` maps member id to its reason."""

    def __init__(self, group_id: str, failures: dict[str, str]) -> None:
        reasons = "; ".join(f"{m}: {r}" for m, r in failures.items())
        super().__init__(
            f"all {len(failures)} members of group {group_id} failed: {reasons}", group_id
        )
        self.failures = failures


class DeadlineError(HedgeError):
    """The group's deadline passed before any member succeeded."""

    def __init__(self, group_id: str, deadline_s: float, failures: dict[str, str]) -> None:
        reasons = "; ".join(f"{m}: {r}" for m, r in failures.items())
        super().__init__(
            f"group {group_id} had no success within deadline_s={deadline_s}: {reasons}", group_id
        )
        self.deadline_s = deadline_s
        self.failures = failures


class NotIdempotentError(HedgeError):
    """Hedging was demanded for an invocation not marked idempotent."""


class WinnerConflictError(HedgeError):
    """The group was closed first by another process with another outcome: its winner
    claim (``holder``, None = it closed without a winner) held, so this coordinator's
    outcome (``winner``, None = no winner) was neither declared nor recorded."""

    def __init__(self, group_id: str, winner: str | None, holder: str | None) -> None:
        super().__init__(
            f"group {group_id} was already closed by another process with winner "
            f"{holder or 'none'}; this coordinator's outcome (winner {winner or 'none'}) "
            "was not declared",
            group_id,
        )
        self.winner = winner
        self.holder = holder


def describe_validation_error(exc: Exception, source: str) -> str:
    """One line per problem of a pydantic ValidationError: where, what was given, what
    was expected. Other exceptions are rendered as they are."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return f"{source}: {exc}"
    lines = []
    for err in errors():
        loc = ".".join(str(p) for p in err.get("loc", ())) or "(top level)"
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        given = err.get("input")
        shown = "" if isinstance(given, dict | list) else f" (got {given!r})"
        lines.append(f"{source}: {loc}: {msg}{shown}")
    return "\n".join(lines)
