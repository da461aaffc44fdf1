"""User scorers for the judge tests (``evaluator.callable = "scorers_example:<name>"``).

The judge imports them by path: the test directory must be on ``sys.path`` (pytest puts it
there; the judge worker subprocess gets it through ``PYTHONPATH``)."""

from __future__ import annotations

from schemas.models import Message

NOT_A_FUNCTION = 0.5


def length_score(request: list[Message], output: str) -> float:
    """One point per character of the output, out of 100."""
    assert request and all(isinstance(m, Message) for m in request)
    return min(1.0, len(output) / 100.0)


def too_high(request: list[Message], output: str) -> float:
    return 1.5


def not_a_number(request: list[Message], output: str) -> object:
    return "excellent"


def nan_score(request: list[Message], output: str) -> float:
    return float("nan")


def broken(request: list[Message], output: str) -> float:
    raise RuntimeError("the checker crashed")
