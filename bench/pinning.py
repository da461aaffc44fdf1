"""CPU pinning of a runtime bench's processes (``python -m bench.runtime … --pin``).

On the 2-core machine the caller, the workers and Redis share both cores; pinning them
apart is what an operator might try first for the hot path's latency, so the bench can
measure it side by side with the unpinned layout (docs/BENCHMARKS.md, issue 12).

    --pin client=0 --pin workers=1 --pin redis=1

``client`` is the bench's own process (the caller and the echo floor's peer), ``workers``
HACO's and bare Celery's workers, ``redis`` the embedded server. A process is pinned
from birth: the thread that spawns it holds the process's CPUs while it forks
(:func:`pinned`), and a child inherits its parent thread's mask with every thread it
starts after, so no thread of it ever runs elsewhere. Linux only.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

ROLES = ("client", "workers", "redis")


@dataclass(frozen=True)
class Pinning:
    """Each role's CPUs; a role left out runs on ``base``, the CPUs this process had
    before any pinning (not on the client's, which it would inherit)."""

    cpus: dict[str, frozenset[int]]
    base: frozenset[int]

    def of(self, role: str) -> frozenset[int]:
        return self.cpus.get(role, self.base)

    def describe(self) -> dict[str, list[int]]:
        return {role: sorted(cpus) for role, cpus in self.cpus.items()}


def parse_pin(specs: list[str] | None, external_redis: bool) -> Pinning | None:
    """``ROLE=CPUS`` specs (CPUS like ``1``, ``0,1`` or ``0-1``) as a :class:`Pinning`,
    else a ValueError naming the bad spec and what was expected."""
    if not specs:
        return None
    if not hasattr(os, "sched_setaffinity"):
        raise ValueError("--pin needs os.sched_setaffinity (Linux); this platform has none")
    allowed = os.sched_getaffinity(0)
    cpus: dict[str, frozenset[int]] = {}
    for spec in specs:
        role, sep, text = spec.partition("=")
        if not sep or role not in ROLES:
            raise ValueError(f"--pin {spec!r}: expected ROLE=CPUS with ROLE one of {ROLES}")
        if role in cpus:
            raise ValueError(f"--pin {spec!r}: {role} is pinned twice")
        if role == "redis" and external_redis:
            raise ValueError(f"--pin {spec!r}: Redis is not embedded (HACO_REDIS_URL is set)")
        got = _cpu_list(spec, text)
        if not got <= allowed:
            raise ValueError(
                f"--pin {spec!r}: CPUs {sorted(got - allowed)} are not among this process's "
                f"{sorted(allowed)}"
            )
        cpus[role] = got
    return Pinning(cpus, frozenset(allowed))


def _cpu_list(spec: str, text: str) -> frozenset[int]:
    out: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            first, last = int(lo), int(hi or lo)
            if first < 0 or last < first:
                raise ValueError
            out.update(range(first, last + 1))
    except ValueError:
        raise ValueError(
            f"--pin {spec!r}: expected CPUs like 1, 0,1 or 0-1 after '=', got {text!r}"
        ) from None
    return frozenset(out)


def pin_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--pin", action="append", metavar="ROLE=CPUS",
        help=f"pin a role ({', '.join(ROLES)}) to CPUs from birth, e.g. workers=1; repeatable",
    )  # fmt: skip


def pin_option(p: argparse.ArgumentParser, specs: list[str] | None) -> Pinning | None:
    """``--pin``'s specs parsed for this machine (Redis embedded unless HACO_REDIS_URL),
    or the parser's error naming the bad one."""
    try:
        return parse_pin(specs, external_redis=bool(os.environ.get("HACO_REDIS_URL")))
    except ValueError as exc:
        p.error(str(exc))


@contextmanager
def pinned(pin: Pinning | None, role: str) -> Iterator[None]:
    """The calling thread on ``role``'s CPUs for the block (what it forks is born there),
    then back on its own mask; nothing without a pinning."""
    if pin is None:
        yield
        return
    cpus = pin.of(role)
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def pin_caller(pin: Pinning | None) -> None:
    """The calling thread, and every thread it starts after, on the client's CPUs."""
    if pin is not None:
        os.sched_setaffinity(0, pin.of("client"))
