"""Checks of the values callers hand the shared state (budget spends, delay samples):
InputError names the argument, the value given and what was expected."""

from __future__ import annotations

import math

from coordinator.errors import InputError


def check_count(name: str, value: int) -> int:
    """``value`` if it is an integer >= 0 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"{name} must be an integer >= 0, got {value!r}")
    return value


def check_amount(name: str, value: float) -> float:
    """``value`` as a float if it is a finite number >= 0 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise InputError(f"{name} must be finite and >= 0, got {value!r}")
    return float(value)
