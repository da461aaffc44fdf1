"""`haco worker` with stamps: where a member's own window goes (bench.memberstamps).

    python -m bench.stampedworker --out FILE -- worker --zone local --concurrency 16

A probe, not a product change: the worker is `haco worker` itself, run as a program (as
``python -m cProfile -m`` runs one) after three wrappers are put in, found by name (a
step that moved fails at once): the lane's record of a message with its member's start
(``MemberLane._record``), a start made in its own round trip (``RedisStore.start_member``:
the second of two members taken together) and the member's backend call
(``workers.member._call``). They note times in memory, about a microsecond each on the
member's path, and a thread writes them to ``FILE`` every :data:`FLUSH_S`, one line per
member: its id, when its start claim was answered, and its backend call's start and end
(``time.time``, the clock of the member's trace).
"""

from __future__ import annotations

import argparse
import runpy
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.rtlib import BenchStack, Services
from coordinator.runtime.liveness import start_key
from coordinator.services.supervisor import worker_command, worker_name
from coordinator.state.store import RedisStore
from workers import lane, member

FLUSH_S = 0.2  # how often the stamps are written: off the members' path
HACO_CLI = "coordinator.cli.main"  # what `haco` runs (pyproject.toml's script)

Stamp = tuple[float, float, float]  # claim answered (0: no stamp), call start, call end


class Stamps:
    """Times noted in the worker: each member's claim answered and its backend call."""

    def __init__(self, out: Path, clock: Callable[[], float] = time.time) -> None:
        self.out = out
        self.clock = clock
        self.made: dict[str, float] = {}  # a start claim's key → its answer
        self.lines: list[str] = []
        self.lock = threading.Lock()

    def wrap_record(self, record: Callable[..., Any]) -> Callable[..., Any]:
        """MemberLane._record: stamped once the start made with the record answered."""

        def stamped(
            owner: Any, tag: str, entry: bytes, begun: Any = None, more: bool = False
        ) -> Any:
            got = record(owner, tag, entry, begun, more)
            if begun is not None and begun.made:
                self.made[begun.start.start_claim] = self.clock()
            return got

        return stamped

    def wrap_start(self, start: Callable[..., Any]) -> Callable[..., Any]:
        """RedisStore.start_member (store, MemberStart): stamped once answered."""

        def stamped(store: Any, s: Any) -> Any:
            got = start(store, s)
            self.made[s.start_claim] = self.clock()
            return got

        return stamped

    def wrap_call(self, call: Callable[..., Any]) -> Callable[..., Any]:
        """workers.member._call (task, backend, stop, ctx): the backend's call, stamped."""

        def stamped(task: Any, *args: Any) -> Any:
            t0 = self.clock()
            try:
                return call(task, *args)
            finally:
                t1 = self.clock()
                made = self.made.pop(start_key(task.member_id), 0.0)
                with self.lock:
                    self.lines.append(f"{task.member_id} {made!r} {t0!r} {t1!r}\n")

        return stamped

    def flush(self) -> None:
        with self.lock:
            lines, self.lines = self.lines, []
        if lines:
            with self.out.open("a", encoding="utf-8") as f:
                f.writelines(lines)

    def flushing(self, stop: threading.Event, every_s: float = FLUSH_S) -> threading.Thread:
        """A thread that writes the stamps every ``every_s`` until ``stop`` is set, and
        once more then."""

        def loop() -> None:
            while not stop.wait(every_s):
                self.flush()
            self.flush()

        t = threading.Thread(target=loop, name="bench-stamps", daemon=True)
        t.start()
        return t


def install(stamps: Stamps) -> Callable[[], None]:
    """The three wrappers put in; returns what puts the originals back."""
    record, start, call = lane.MemberLane._record, RedisStore.start_member, member._call
    own_start = "start_member" in vars(RedisStore)  # else inherited (RedisMemberOps')
    lane.MemberLane._record = stamps.wrap_record(record)  # type: ignore[method-assign]
    RedisStore.start_member = stamps.wrap_start(start)  # type: ignore[method-assign]
    member._call = stamps.wrap_call(call)

    def restore() -> None:
        lane.MemberLane._record = record  # type: ignore[method-assign]
        if own_start:
            RedisStore.start_member = start  # type: ignore[method-assign]
        else:
            del RedisStore.start_member  # the inherited one shows again
        member._call = call

    return restore


def read_stamps(path: Path) -> dict[str, Stamp]:
    """A stamps file's members: id → (claim answered or 0, call start, call end)."""
    out: dict[str, Stamp] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            mid, made, t0, t1 = line.split()
            out[mid] = (float(made), float(t0), float(t1))
    return out


def stamps_file(folder: Path, zone: str) -> Path:
    return folder / f"stamps-{zone}.txt"


class StampedStack(BenchStack):
    """The bench's stack, its HACO workers stamped (their stamps in ``stamps_dir``)."""

    stamps_dir: Path = Path(".")

    def start_worker(self, zone: str, concurrency: int | None = None) -> Any:
        plain = worker_command(zone, concurrency)
        if plain[1:3] != ["-m", HACO_CLI]:
            raise RuntimeError(f"`haco worker` is no longer {HACO_CLI}'s: {plain}")
        out = stamps_file(self.stamps_dir, zone)
        cmd = [sys.executable, "-m", "bench.stampedworker", "--out", str(out), "--"]
        proc = self._spawn([*cmd, *plain[3:]], worker_name(zone))
        self.workers[zone] = proc
        return proc


class StampedServices(Services):
    """The bench's services, its HACO workers stamped (stamps in ``tmp``)."""

    def _stack(self) -> BenchStack:
        plain = super()._stack()
        stack = StampedStack(plain.redis_url, None, log_dir=plain.log_dir)
        stack.extra_env, stack.stamps_dir = plain.extra_env, self.tmp
        return stack


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.stampedworker")
    p.add_argument("--out", type=Path, required=True, help="where the stamps go")
    p.add_argument("haco", nargs=argparse.REMAINDER, help="-- and haco's arguments")
    args = p.parse_args(argv)
    stamps, stop = Stamps(args.out), threading.Event()
    install(stamps)
    writer = stamps.flushing(stop)
    sys.argv = ["haco", *[a for a in args.haco if a != "--"]]
    try:
        runpy.run_module(HACO_CLI, run_name="__main__", alter_sys=True)
    finally:  # the worker stopped (warm shutdown): its last stamps written
        stop.set()
        writer.join()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
