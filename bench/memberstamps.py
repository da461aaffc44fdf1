"""Where a 1-member call's time goes on its worker: the member's own window taken apart.

    python -m bench.memberstamps [--n 1000] [--rounds 10] [--concurrency 16] [--json PATH]

The dispatch overhead of the issue-12 goal (bench/rtoverhead.py) is a group's latency
less its fastest member's own time, the trace's ``finished_at_s − started_at_s``. That
window opens when the worker takes the member (workers.member.begin_member), before the
member's start claim, so it holds more than the backend's call: the claim's round trip
(the lane's record and start, ``lane_start.lua``), the hand-off to the member's run, the
backend's call itself (for the simulated backend: its draw, its wait and its result),
and what follows the call up to the finish stamp. This bench runs HACO's worker with
stamps at those points and counts the same calls both ways: less the member's own time
(the goal's figure) and less the backend's call alone, each beside bare Celery's round
trip of an echo task, measured in interleaved blocks of the same run.

A probe, not a product change: the stamped worker (``python -m bench.memberstamps
worker``) is `haco worker` with two wrappers put in before it starts (the lane's record
of a message with its start, and the member's backend call), which note times in memory
and write them to a file from a thread every :data:`FLUSH_S`. Each stamp costs about a
microsecond on the member's path. Members whose start was made in their own round trip
(the second of two taken together) have no claim stamp; a 1-member call's always has.
Redis is HACO_REDIS_URL, else embedded; one worker with ``--concurrency`` threads.
"""

from __future__ import annotations

import argparse
import runpy
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.bare_celery import create_bare_app, send_echo
from bench.console import emit
from bench.machine import after, machine, server_info
from bench.rtbench import CALL_DEADLINE_S, wait_ready
from bench.rtlib import (
    READY_TIMEOUT_S,
    ZONE,
    BenchStack,
    Services,
    bench_client,
    read_traces,
    summary_ms,
)
from coordinator.services.supervisor import worker_command, worker_name
from workers import lane, member

FLUSH_S = 0.2  # how often the stamped worker writes its stamps: off the members' path
SETTLE_S = 1.0  # after the last call: the last stamps written and traces appended
WARMUP = 50  # unmeasured calls of each system: connections made, scripts loaded
ROUNDS = 10  # blocks per system, interleaved: a slow spell falls on each alike
BARE_KEY = "bench:stamps:bare"
HACO_CLI = "coordinator.cli.main"  # what `haco` runs (pyproject.toml's script)

Stamp = tuple[float, float, float]  # claim answered (0: not in the lane), call start, end


# ---------------------------------------------------------------- the stamped worker


class Stamps:
    """Times noted in the worker: each member's claim answer and its backend call."""

    def __init__(self, out: Path, clock: Callable[[], float] = time.time) -> None:
        self.out = out
        self.clock = clock
        self.made: dict[str, float] = {}  # member id → its start claim answered
        self.lines: list[str] = []
        self.lock = threading.Lock()

    def wrap_record(self, record: Callable[..., Any]) -> Callable[..., Any]:
        """MemberLane._record: stamped once the start made with the record answered."""

        def stamped(
            owner: Any, tag: str, entry: bytes, begun: Any = None, more: bool = False
        ) -> Any:
            got = record(owner, tag, entry, begun, more)
            if begun is not None and begun.made:
                self.made[begun.task.member_id] = self.clock()
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
                made = self.made.pop(task.member_id, 0.0)
                with self.lock:
                    self.lines.append(f"{task.member_id} {made!r} {t0!r} {t1!r}\n")

        return stamped

    def flush(self) -> None:
        with self.lock:
            lines, self.lines = self.lines, []
        if lines:
            with self.out.open("a", encoding="utf-8") as f:
                f.writelines(lines)

    def flushing(self, every_s: float = FLUSH_S) -> threading.Thread:
        def loop() -> None:
            while True:
                time.sleep(every_s)
                self.flush()

        t = threading.Thread(target=loop, name="bench-stamps", daemon=True)
        t.start()
        return t


def install(stamps: Stamps) -> Callable[[], None]:
    """The two wrappers put in (the worker's code, found by name: a step that moved fails
    here); returns what puts the originals back."""
    record, call = lane.MemberLane._record, member._call
    lane.MemberLane._record = stamps.wrap_record(record)  # type: ignore[method-assign]
    member._call = stamps.wrap_call(call)

    def restore() -> None:
        lane.MemberLane._record = record  # type: ignore[method-assign]
        member._call = call

    return restore


def read_stamps(path: Path) -> dict[str, Stamp]:
    """The stamps file's members: id → (claim answered or 0, call start, call end)."""
    out: dict[str, Stamp] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            mid, made, t0, t1 = line.split()
            out[mid] = (float(made), float(t0), float(t1))
    return out


def worker_main(argv: list[str]) -> int:
    """``worker --out FILE -- <haco's arguments>``: `haco` with the stamps put in."""
    p = argparse.ArgumentParser(prog="python -m bench.memberstamps worker")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("haco", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    stamps = Stamps(args.out)
    install(stamps)
    stamps.flushing()
    # The CLI run as a program, as `python -m cProfile -m` runs one: `haco worker` itself,
    # with the wrappers in, and nothing of the CLI imported by the bench.
    sys.argv = ["haco", *[a for a in args.haco if a != "--"]]
    runpy.run_module(HACO_CLI, run_name="__main__", alter_sys=True)
    return 0


def stamps_file(folder: Path, zone: str) -> Path:
    return folder / f"stamps-{zone}.txt"


class StampedStack(BenchStack):
    """The bench's stack, its HACO workers stamped (their stamps in ``stamps_dir``)."""

    stamps_dir: Path = Path(".")

    def start_worker(self, zone: str, concurrency: int | None = None) -> Any:
        plain = worker_command(zone, concurrency)
        if plain[1:3] != ["-m", HACO_CLI]:
            raise RuntimeError(f"`haco worker` is no longer {HACO_CLI}'s: {plain}")
        haco = plain[3:]
        out = stamps_file(self.stamps_dir, zone)
        cmd = [sys.executable, "-m", "bench.memberstamps", "worker", "--out", str(out), "--"]
        proc = self._spawn([*cmd, *haco], worker_name(zone))
        self.workers[zone] = proc
        return proc


class StampedServices(Services):
    def _stack(self) -> BenchStack:
        plain = super()._stack()
        stack = StampedStack(plain.redis_url, None, log_dir=plain.log_dir)
        stack.extra_env, stack.stamps_dir = plain.extra_env, self.tmp
        return stack


# ---------------------------------------------------------------- the calls


def split(
    rows: list[tuple[str, float, float]],
    traces: dict[str, list[dict[str, Any]]],
    stamps: dict[str, Stamp],
) -> dict[str, list[float]]:
    """Each call (group id, start, end) taken apart, in seconds, by part: its latency,
    its member's own time, the claim's round trip, the hand-off, the backend's call, what
    follows it, and the call less its own time and less the call alone. A call whose
    member has no trace, no stamp or no claim stamp is left out (counted: ``missing``)."""
    parts: dict[str, list[float]] = {k: [] for k in PARTS}
    missing = 0
    for gid, t0, t1 in rows:
        done = [m for m in traces.get(gid, []) if m["status"] == "succeeded"]
        s = stamps.get(done[0]["member_id"]) if len(done) == 1 else None
        if s is None or s[0] <= 0.0:
            missing += 1
            continue
        made, c0, c1 = s
        started, finished = float(done[0]["started_at_s"]), float(done[0]["finished_at_s"])
        e2e, drawn = t1 - t0, float(done[0].get("proc_latency_s") or 0.0)
        values = {
            "call": e2e, "own": finished - started, "claim": made - started,
            "handoff": c0 - made, "backend": c1 - c0, "beyond_draw": c1 - c0 - drawn,
            "after": finished - c1, "less_own": e2e - (finished - started),
            "less_backend": e2e - (c1 - c0),
        }  # fmt: skip
        for k, v in values.items():
            parts[k].append(v)
    parts["missing"] = [float(missing)]
    return parts


PARTS = {
    "call": "HACO's call (1 member), caller's start to its answer",
    "less_own": "· less its member's own time (the goal's overhead)",
    "less_backend": "· less the backend's call alone",
    "own": "the member's own time (finished − started)",
    "claim": "· the start claim's round trip (record and start)",
    "handoff": "· the hand-off to its run, the backend built",
    "backend": "· the backend's call",
    "beyond_draw": "  · of it beyond the drawn latency",
    "after": "· after the call, to the finish stamp",
}


def _bare_block(app: Any, r: Any, n: int) -> list[float]:
    out: list[float] = []
    for i in range(n):
        t0 = time.perf_counter()
        send_echo(app, BARE_KEY, str(i))
        if r.brpop([BARE_KEY], timeout=READY_TIMEOUT_S) is None:
            raise RuntimeError("bare worker silent")
        out.append(time.perf_counter() - t0)
    return out


def run(svc: Services, n: int, rounds: int = ROUNDS, warmup: int = WARMUP) -> dict[str, Any]:
    """``n`` 1-member calls and ``n`` bare round trips in ``rounds`` interleaved blocks,
    after ``warmup`` of each; ``svc``'s HACO worker is stamped (:class:`StampedServices`)."""
    client = bench_client(svc.url)
    app = create_bare_app(svc.url)
    r = svc.app_redis
    bare: list[float] = []
    rows: list[tuple[str, float, float]] = []
    try:
        wait_ready(client, "one", svc)
        for _ in range(warmup):
            client.invoke("one", "warm", deadline_s=CALL_DEADLINE_S)
        _bare_block(app, r, warmup)
        size = max(1, n // rounds)
        while len(rows) < n:
            k = min(size, n - len(rows))
            bare += _bare_block(app, r, k)
            for _ in range(k):
                t0 = time.time()
                res = client.invoke("one", "x", deadline_s=CALL_DEADLINE_S)
                rows.append((res.group_id, t0, time.time()))
        time.sleep(SETTLE_S)
    finally:
        client.close()
        app.close()
    found = read_stamps(stamps_file(svc.tmp, ZONE))
    parts = split(rows, read_traces(r), found)
    missing = int(parts.pop("missing")[0])
    bare_ms = summary_ms(bare)
    out = {k: summary_ms(v) for k, v in parts.items() if v}
    ratios = {
        f"{k}_over_bare_{q}": out[k][f"{q}_ms"] / bare_ms[f"{q}_ms"]
        for k in ("less_own", "less_backend") if k in out for q in ("p50", "p99")
    }  # fmt: skip
    return {"n": n, "rounds": rounds, "missing": missing, "bare_roundtrip": bare_ms,
            "haco_1": out, "ratios": ratios}  # fmt: skip


def table(res: dict[str, Any]) -> Table:
    t = Table(
        title="a 1-member call and its member's own window, ms",
        caption=f"{res['n']} calls each, {res['rounds']} interleaved blocks; "
        f"{res['missing']} calls without stamps left out",
    )
    for c in ("part", "p50", "p99", "p50 / bare p50"):
        t.add_column(c, justify="left" if c == "part" else "right")
    bare = res["bare_roundtrip"]
    t.add_row("bare Celery's round trip (echo task)", f"{bare['p50_ms']:.3f}",
              f"{bare['p99_ms']:.3f}", "1.00")  # fmt: skip
    for k, name in PARTS.items():
        if (s := res["haco_1"].get(k)) is not None:
            ratio = s["p50_ms"] / bare["p50_ms"]
            t.add_row(name, f"{s['p50_ms']:.3f}", f"{s['p99_ms']:.3f}", f"{ratio:.2f}")
    return t


def main(argv: list[str]) -> int:
    if argv[:1] == ["worker"]:
        return worker_main(argv[1:])
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--n", type=int, default=1000, help="calls of each system")
    p.add_argument("--rounds", type=int, default=ROUNDS, help="interleaved blocks")
    p.add_argument("--concurrency", type=int, default=16, help="threads of each worker")
    p.add_argument("--json", type=Path, help="also write the JSON here")
    args = p.parse_args(argv)
    if args.n < 10 or not 1 <= args.rounds <= args.n or args.concurrency < 1:
        p.error(
            f"--n must be >= 10, --rounds in 1..n, --concurrency >= 1; got {args.n}, "
            f"{args.rounds} and {args.concurrency}"
        )
    before = machine()
    with tempfile.TemporaryDirectory(prefix="haco-bench-") as tmp:
        svc = StampedServices(Path(tmp), args.concurrency)
        try:
            svc.start_haco()
            svc.start_bare()
            res = run(svc, args.n, args.rounds)
            res["redis"] = server_info(svc.app_redis)
        finally:
            svc.close()
    res["command"] = " ".join(["python -m bench.memberstamps", *argv])
    res["machine"] = after(before)
    emit(res, table(res), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
