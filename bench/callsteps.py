"""Where a call's time goes in the caller, step by step, around its send.

    python -m bench.callsteps [--n 3000] [--role one|two] [--concurrency 16] [--json PATH]

The overhead bench (bench/rtoverhead.py) gives a call's stages: the plan (the call's
start to its send), the dispatch, the member's own time, the reply and the finish. This
bench splits the caller's part of them into its steps, on the overhead bench's roles
(``one``: 1 member; ``two``: 2 members in parallel) with sequential calls: each step
below is timed with ``perf_counter`` around it, on ``--n`` warm calls, and given as its
median per call (a step run twice in a call, once per member, counts as their sum).

A timed step's figure holds the timer's own cost, given as ``timer``: the same wrapper
around a function that does nothing. ``plan, the rest`` is the plan less the steps
timed inside it (the group's id, the budget's credit, the launcher, the group itself).
The steps are found by name; a step that moved or was renamed fails the bench at once
(``tests/test_callsteps.py`` checks that every one is found). Redis is HACO_REDIS_URL,
else embedded; one worker with ``--concurrency`` threads.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.table import Table

import coordinator.runtime.coordinator as coordinator_module
from bench.console import emit
from bench.rtbench import CALL_DEADLINE_S, on_worker, wait_ready
from bench.rtlib import Services, bench_client, summary_ms
from bench.rtoverhead import TWO_MEMBERS
from coordinator.core.methods import Haco
from coordinator.runtime.client import HacoClient

WARMUP = 500  # unmeasured calls: connections made, scripts loaded, the view cached
ROLES = {"one": {}, "two": TWO_MEMBERS}

# (where the step lives, its attribute, its name in the table), in call order. Where:
# the client, its coordinator and the coordinator's parts, the coordinator's module (a
# function it calls by its module-level name) or the allocation rule's class.
STEPS: tuple[tuple[str, str, str], ...] = (
    ("client", "invocation", "the invocation built (validated)"),
    ("coordinator", "_plan", "the plan"),
    ("pool", "call_settings", "· the call's settings"),
    ("module", "payload_bytes", "· the payload's size"),
    ("views", "view", "· the pool's view"),
    ("rule", "choose", "· the rule (Haco.choose)"),
    ("module", "watch_for", "· the members' watch"),
    ("coordinator", "_launch_initial", "the launch"),
    ("coordinator", "_prepare", "· each member noted launched"),
    ("module", "member_task", "  · its task built"),
    ("module", "stage_closes", "· the staged closes"),
    ("dispatcher", "_publish", "· the send"),
    ("wire", "message", "  · each member's Celery message"),
    ("coordinator", "_wait", "the wait for the verdict"),
    ("coordinator", "_finish", "the finish"),
)
PLAN_PARTS = ("call_settings", "payload_bytes", "view", "choose", "watch_for")


def _owners(client: HacoClient) -> dict[str, Any]:
    coord = client.coordinator
    return {
        "client": client,
        "coordinator": coord,
        "pool": coord.pool,
        "views": coord.views,
        "dispatcher": coord.dispatcher,
        "wire": getattr(coord.dispatcher, "wire", None),  # a CeleryDispatcher's
        "module": coordinator_module,
        "rule": Haco,
    }


class StepTimes:
    """Each measured call's time per step (seconds; a step run twice adds up)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, float]] = []
        self.current: dict[str, float] | None = None

    def wrap(self, f: Callable[..., Any], attr: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                if self.current is not None:
                    dt = time.perf_counter() - t0
                    self.current[attr] = self.current.get(attr, 0.0) + dt

        return timed


@contextmanager
def timed_steps(client: HacoClient, times: StepTimes) -> Iterator[None]:
    """Every step of :data:`STEPS` timed into ``times`` while inside; put back after.
    A step not found raises AttributeError, naming it."""
    owners = _owners(client)
    put: list[tuple[Any, str, Any, bool]] = []  # owner, attribute, original, own attribute
    try:
        for where, attr, _ in STEPS:
            owner = owners[where]
            original = getattr(owner, attr)  # AttributeError: the step moved
            # Its own attribute (a module's function, the class's method) is put back;
            # an instance's shadow of its class's method is deleted.
            put.append((owner, attr, original, attr in vars(owner)))
            # On a class (the rule), the wrapper is a function: bound as a method, its
            # first argument is the instance. On an instance, it shadows the bound method.
            setattr(owner, attr, times.wrap(original, attr))
        yield
    finally:
        for owner, attr, original, own in reversed(put):
            if own:
                setattr(owner, attr, original)
            else:
                delattr(owner, attr)


def timer_cost_s(n: int) -> list[float]:
    """The wrapper's own cost: a call of a wrapped function that does nothing, timed
    from outside the way a step is timed inside (its time less an unwrapped call's)."""

    def noop() -> None:
        return None

    times = StepTimes()
    wrapped = times.wrap(noop, "noop")
    out: list[float] = []
    for _ in range(n):
        times.current = {}
        t0 = time.perf_counter()
        wrapped()
        t1 = time.perf_counter()
        noop()
        t2 = time.perf_counter()
        out.append(max(0.0, (t1 - t0) - (t2 - t1)))
    return out


def run(svc: Services, n: int, role: str, warmup: int = WARMUP) -> dict[str, Any]:
    client = bench_client(svc.url)  # the coordinator's own parts, no bench marks
    opts = ROLES[role]
    times = StepTimes()
    totals: list[float] = []
    try:
        wait_ready(client, role, svc)
        with timed_steps(client, times):
            for i in range(warmup + n):
                times.current = {} if i >= warmup else None
                t0 = time.perf_counter()
                client.invoke(role, "x", deadline_s=CALL_DEADLINE_S, **opts)
                if times.current is not None:
                    totals.append(time.perf_counter() - t0)
                    times.calls.append(times.current)
    finally:
        client.close()
    steps: dict[str, Any] = {}
    for _, attr, name in STEPS:
        got = [c[attr] for c in times.calls if attr in c]
        steps[attr] = {"name": name, **summary_ms(got)}
    rest = [c["_plan"] - sum(c.get(p, 0.0) for p in PLAN_PARTS) for c in times.calls]
    return {
        "role": role,
        "calls": n,
        "steps": steps,
        "plan_rest": summary_ms(rest),
        "call": summary_ms(totals),
        "timer": summary_ms(timer_cost_s(n)),
    }


def table(res: dict[str, Any]) -> Table:
    t = Table(
        title=f"a call's steps in the caller, µs (role {res['role']!r})",
        caption=f"{res['calls']} sequential warm calls; a step's figure holds the timer's",
    )
    for c in ("step", "calls", "p50", "p90"):
        t.add_column(c, justify="left" if c == "step" else "right")

    def row(name: str, s: dict[str, Any]) -> None:
        t.add_row(name, str(s["n"]), f"{s['p50_ms'] * 1e3:.1f}", f"{s['p90_ms'] * 1e3:.1f}")

    for attr, s in res["steps"].items():
        row(s["name"], s)
        if attr == "watch_for":
            row("· the plan, the rest", res["plan_rest"])
    row("the whole call", res["call"])
    row("timer", res["timer"])
    return t


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--n", type=int, default=3000, help="measured calls")
    p.add_argument("--role", choices=sorted(ROLES), default="one")
    p.add_argument("--concurrency", type=int, default=16, help="threads of the worker")
    p.add_argument("--json", type=Path, help="also write the JSON here")
    args = p.parse_args(argv)
    if args.n < 1 or args.concurrency < 1:
        p.error(f"--n and --concurrency must be >= 1, got {args.n} and {args.concurrency}")
    res = on_worker(
        "bench.callsteps", argv, args.concurrency, lambda svc: run(svc, args.n, args.role)
    )
    emit(res, table(res), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
