"""Where a member's Redis server time goes, by command and script, beside bare Celery's.

    python -m bench.redistime [--duration 5] [--clients 32] [--concurrency 16] [--json PATH]

bench/runtime.py's throughput reads Redis's CPU per member task as one number; this
bench splits it. The same load as there (``--clients`` threads calling in a loop, one
worker with ``--concurrency`` threads, Redis HACO_REDIS_URL else embedded), first bare
Celery's echo task, then a one-member HACO call, each for ``--duration`` seconds after a
second's warm-up, with Redis's slow log taking every command (``slowlog-log-slower-than
0``). Each log entry is one command's time on the server's main thread, a script's
nested calls included; a script is named by its source (coordinator/state/*.lua, the
kombu QoS scripts), an unknown one by its SHA. Per system: server µs per member task and
calls per member task, by name. The slow log's own bookkeeping is not in its entries,
and on a loaded 2-core machine every entry includes the time the server waited for a
core: compare the two systems side by side, not with bench.reportscript's idle figures.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import redis
from rich.table import Table

from bench.console import emit
from bench.machine import after, machine, server_info
from bench.rtbench import _drain, load_calls, load_phase, tasks_done
from bench.rtlib import Services
from coordinator.core.percentiles import median
from coordinator.state.budget import earn_script, spend_script
from coordinator.state.kombu_redis import ACK_SCRIPT, APPEND_SCRIPT
from coordinator.state.lua import FUNCTIONS, script

SLOWLOG_MAX = 2_000_000  # entries kept; a phase of 5 s logs well under 100k
LUA = Path(__file__).resolve().parents[1] / "coordinator" / "state"


def script_names() -> dict[str, str]:
    """SHA1 of each script this tree runs, as the server names it, to a label."""
    # Each script as it is sent: with the functions it calls (coordinator.state.lua).
    texts = {f.stem: script(f.stem) for f in LUA.glob("*.lua") if f.stem not in FUNCTIONS}
    texts |= {
        "budget_earn": earn_script(),
        "budget_spend": spend_script(),
        "kombu QoS append": APPEND_SCRIPT,
        "kombu QoS ack": ACK_SCRIPT,
    }
    return {
        hashlib.sha1(t.encode(), usedforsecurity=False).hexdigest(): k for k, t in texts.items()
    }


def _label(args: list[bytes], names: dict[str, str]) -> str:
    cmd = args[0].decode("utf-8", "replace").lower()
    if cmd in ("evalsha", "evalsha_ro") and len(args) > 1:
        sha = args[1].decode("utf-8", "replace")
    elif cmd in ("eval", "eval_ro") and len(args) > 1:  # a script's text, after NOSCRIPT
        sha = hashlib.sha1(args[1], usedforsecurity=False).hexdigest()  # (if not cut off)
    else:
        return cmd
    return f"script {names.get(sha, sha[:8])}"


@contextlib.contextmanager
def every_command_logged(r: redis.Redis) -> Iterator[None]:
    """The server's slow log takes every command meanwhile; its settings put back after
    (the log emptied: it held this bench's entries)."""
    before = {str(k): str(v) for k, v in r.config_get("slowlog-*").items()}
    r.config_set("slowlog-max-len", SLOWLOG_MAX)
    r.config_set("slowlog-log-slower-than", 0)
    try:
        yield
    finally:
        for name in ("slowlog-log-slower-than", "slowlog-max-len"):
            if name in before:
                r.config_set(name, before[name])
        r.slowlog_reset()


def read_log(r: redis.Redis) -> list[Any]:
    """Every entry of the slow log, newest first, each [id, unix s, µs, args, client
    address, client name] (redis-py's slowlog_get drops the address)."""
    return cast(list[Any], r.execute_command("SLOWLOG", "GET", "-1"))  # type: ignore[no-untyped-call]


def measured_phase(
    r: redis.Redis, call: Callable[[int], object], clients: int, dur_s: float, svc: Services
) -> tuple[dict[str, Any], list[Any]]:
    """One load phase with the slow log taking every command of its timed window: the
    log is emptied when the window opens and read when it closes (load_phase's CPU
    readings mark both)."""
    logs: list[list[Any]] = []

    def at_mark() -> dict[str, float]:
        if logs:
            logs[0] = read_log(r)
        else:
            logs.append([])
            r.slowlog_reset()
        return svc.cpu()

    with every_command_logged(r):
        res = load_phase(call, clients, 1.0, dur_s, at_mark)
    _drain(svc)
    log = logs[0] if logs else []
    if len(log) >= SLOWLOG_MAX:
        raise RuntimeError(f"the slow log overflowed ({len(log)} entries): shorten --duration")
    # The reset and the read themselves are logged too.
    return res, [e for e in log if _label(e[3], {}) not in ("slowlog", "slowlog|reset")]


LUA_CLIENT = (b"?:0", b"")  # the address Redis logs for a command a script called


def top_level(entries: list[Any]) -> list[Any]:
    """The entries of commands a client sent: the server logs each command a script
    calls too, just before the script's own entry (which includes its time). Redis logs
    those under its Lua client's address, so they are known; Valkey logs them under the
    caller's, and then, walking back from a script, the entries of the same connection
    right before it, while their time fits in the script's, are taken as its calls (a
    script runs alone; under load other clients' commands come between a connection's
    own, so a command the caller sent just before is rarely taken for one)."""
    ordered = sorted(entries, key=lambda e: int(e[0]))  # the log is newest first
    if any(e[4] in LUA_CLIENT for e in ordered):
        return [e for e in ordered if e[4] not in LUA_CLIENT]
    nested: set[int] = set()
    for i, e in enumerate(ordered):
        if not _label(e[3], {}).startswith("script"):
            continue
        left, j = int(e[2]), i - 1
        while j >= 0 and ordered[j][4] == e[4] and int(ordered[j][2]) <= left:
            if _label(ordered[j][3], {}).startswith("script"):
                break
            left -= int(ordered[j][2])
            nested.add(j)
            j -= 1
    return [e for i, e in enumerate(ordered) if i not in nested]


def by_name(entries: list[Any], names: dict[str, str], tasks: float) -> dict[str, Any]:
    us: dict[str, list[int]] = defaultdict(list)
    for e in entries:
        us[_label(e[3], names)].append(int(e[2]))
    rows = {
        k: {
            "us_per_task": sum(v) / tasks,
            "calls_per_task": len(v) / tasks,
            "p50_us_per_call": median([float(x) for x in v]),
        }
        for k, v in us.items()
    }
    order = sorted(rows, key=lambda k: -rows[k]["us_per_task"])
    return {k: rows[k] for k in order}


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    svc = Services(tmp, args.concurrency)
    names = script_names()
    out: dict[str, Any] = {"redis": server_info(svc.app_redis)}
    try:
        with load_calls(svc) as calls:
            for name in ("bare", "haco-1"):
                res, entries = measured_phase(
                    svc.app_redis, calls[name], args.clients, args.duration, svc
                )
                n = tasks_done(svc, name, res)
                tasks = max(1.0, n)
                rows = by_name(top_level(entries), names, tasks)
                out[name] = {
                    "tasks": n,
                    "errors": res["n_errors"],
                    "server_us_per_task": sum(x["us_per_task"] for x in rows.values()),
                    # the server's CPU (INFO cpu) over the same window: also its socket
                    # reads and writes, which no entry holds, and the slow log's own cost
                    "redis_cpu_us_per_task": res["cpu_s"]["redis"] / tasks * 1e6,
                    "by_name": rows,
                }
    finally:
        svc.close()
    return out


def table(res: dict[str, Any], top: int) -> Table:
    t = Table(title="Redis server µs per member task, by command or script")
    for c in ("command / script", "bare µs", "bare calls", "haco-1 µs", "haco-1 calls"):
        t.add_column(c, justify="left" if c.startswith("command") else "right")
    bare, haco = res["bare"]["by_name"], res["haco-1"]["by_name"]
    order = list(dict.fromkeys([*list(haco)[:top], *list(bare)[:top]]))
    for k in order:
        b, h = bare.get(k), haco.get(k)
        t.add_row(
            k,
            f"{b['us_per_task']:.1f}" if b else "—",
            f"{b['calls_per_task']:.2f}" if b else "—",
            f"{h['us_per_task']:.1f}" if h else "—",
            f"{h['calls_per_task']:.2f}" if h else "—",
        )
    for label, key in (
        ("all entries", "server_us_per_task"),
        ("server CPU", "redis_cpu_us_per_task"),
    ):
        t.add_row(label, f"{res['bare'][key]:.1f}", "", f"{res['haco-1'][key]:.1f}", "")
    return t


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--duration", type=float, default=5.0, help="s per system")
    p.add_argument("--clients", type=int, default=32, help="client threads")
    p.add_argument("--concurrency", type=int, default=16, help="threads per worker")
    p.add_argument("--top", type=int, default=12, help="rows of each system in the table")
    p.add_argument("--json", type=Path, help="also write the JSON here")
    args = p.parse_args(argv)
    if args.duration <= 0 or args.clients < 1 or args.concurrency < 1 or args.top < 1:
        p.error(
            "--duration must be > 0 and --clients, --concurrency, --top >= 1, got "
            f"{args.duration}, {args.clients}, {args.concurrency}, {args.top}"
        )
    before = machine()
    with tempfile.TemporaryDirectory(prefix="haco-bench-") as tmp:
        res = run(args, Path(tmp))
    res["command"] = " ".join(["python -m bench.redistime", *argv])
    res["machine"] = after(before)
    res["redis"]["source"] = "HACO_REDIS_URL" if os.environ.get("HACO_REDIS_URL") else "embedded"
    emit(res, table(res, args.top), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
