"""Every error HACO raises on purpose derives from :class:`HacoError`.

::

    HacoError
    ├── InputError              bad input at a boundary (API, CLI, files, payloads)
    │   ├── ScenarioError       a scenario or pool file that does not describe a valid world
    │   └── PlanInputError      a `haco plan` request that cannot be planned
    └── PolicyError             the allocation rule was asked something it cannot answer

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


class PolicyError(HacoError):
    """The allocation rule was called with arguments it cannot decide on."""


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
