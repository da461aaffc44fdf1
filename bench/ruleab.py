"""The allocation rule's path on a 1-member call, side by side in one run: the plan's
rule in floats (``Haco.choose``, coordinator.core.smallpool, what the runtime runs) and
the rule with every term in numpy (``Haco.decide``, what the plan ran before).

    python -m bench.ruleab [--n 4000] [--block 5] [--json PATH]

One HACO worker (the bench pool of bench/runtime.py, its role ``one``) and one caller:
``--n`` sequential calls in blocks of ``--block``, the blocks alternating between the
two paths, so a slow spell of the machine falls on both alike. Per path: the dispatch
overhead (the group's latency less its member's own, as bench/runtime.py's overhead) and
the plan stage (the call's start to its first send), p50 and p90, and the difference
between the paths' p50s. The rule's decision is the same on both paths, bit for bit
(tests/test_smallpool.py): only its cost differs.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from bench.console import show
from bench.machine import after, machine, server_info
from bench.rtbench import CALL_DEADLINE_S, wait_ready
from bench.rtlib import ZONE, Services, own_latency, read_traces, summary_ms, timed_client
from coordinator.core.methods import Decision, Haco, PoolView
from coordinator.runtime import coordinator as runtime_coordinator

PATHS = ("choose", "decide")  # the runtime's rule path, and the numpy one beside it
WARM = 300
_RNG = np.random.default_rng(0)  # Haco.decide's argument; the rule draws nothing


class _Switch:
    decide = False  # the current block's path


def _switched(switch: type[_Switch]) -> type[Haco]:
    class SwitchedHaco(Haco):
        """The coordinator's rule, taking the numpy path while the switch says so."""

        def choose(self, view: PoolView) -> Decision:
            return self.decide(view, _RNG) if switch.decide else super().choose(view)

    return SwitchedHaco


def run(n: int, block: int) -> dict[str, Any]:
    rows: dict[str, list[tuple[str, float, float]]] = {p: [] for p in PATHS}
    before = machine()
    setattr(runtime_coordinator, "Haco", _switched(_Switch))  # noqa: B010 (the plan's rule)
    with tempfile.TemporaryDirectory(prefix="haco-bench-") as tmp:
        svc = Services(Path(tmp), concurrency=16)
        try:
            svc.start_haco((ZONE,))
            client, marks = timed_client(svc.url)
            try:
                wait_ready(client, "one", svc)
                for _ in range(WARM):
                    client.invoke("one", "warm", deadline_s=CALL_DEADLINE_S)
                since = int(time.time() * 1000)
                for i in range(n):
                    _Switch.decide = (i // block) % 2 == 1
                    t0 = time.time()
                    res = client.invoke("one", "x", deadline_s=CALL_DEADLINE_S)
                    rows[PATHS[_Switch.decide]].append((res.group_id, t0, time.time()))
                time.sleep(0.3)  # the last members append their traces
                traces = read_traces(svc.app_redis, since)
                redis_info = server_info(svc.app_redis)
            finally:
                client.close()
        finally:
            svc.close()
            setattr(runtime_coordinator, "Haco", Haco)  # noqa: B010
    out: dict[str, Any] = {"n": n, "block": block}
    for path, calls in rows.items():
        over, plan = [], []
        for gid, t0, t1 in calls:
            done = [m for m in traces.get(gid, []) if m["status"] == "succeeded"]
            if done:
                over.append(t1 - t0 - min(own_latency(m) for m in done))
            plan.append(min(s for s, _ in marks.sent[gid].values()) - t0)
        out[path] = {"overhead": summary_ms(over), "plan": summary_ms(plan), "calls": len(calls)}
    for k in ("overhead", "plan"):
        out[f"{k}_p50_saved_ms"] = out["decide"][k]["p50_ms"] - out["choose"][k]["p50_ms"]
    out["redis"] = redis_info
    out["machine"] = after(before)
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=4000, help="calls in all, both paths")
    p.add_argument("--block", type=int, default=5, help="calls per block of one path")
    p.add_argument("--json", type=Path, help="also write the JSON here")
    args = p.parse_args(argv)
    if args.n < 2 * args.block or args.block < 1:
        p.error(f"need --block ≥ 1 and --n ≥ 2 blocks; got --n {args.n} --block {args.block}")
    res = run(args.n, args.block)
    res["command"] = " ".join(["python -m bench.ruleab", *argv])
    t = Table(title=f"the rule's path on a 1-member call, ms ({args.n} calls, blocks of "
              f"{args.block} alternating)")  # fmt: skip
    for c in ("path", "overhead p50", "overhead p90", "plan p50", "plan p90"):
        t.add_column(c, justify="left" if c == "path" else "right")
    for path, label in (("choose", "Haco.choose (floats)"), ("decide", "Haco.decide (numpy)")):
        o, pl = res[path]["overhead"], res[path]["plan"]
        t.add_row(
            label, *(f"{x:.3f}" for x in (o["p50_ms"], o["p90_ms"], pl["p50_ms"], pl["p90_ms"]))
        )
    t.add_row(
        "saved (p50)",
        f"{res['overhead_p50_saved_ms']:.3f}",
        "",
        f"{res['plan_p50_saved_ms']:.3f}",
        "",
    )
    show(t)
    text = json.dumps(res, indent=2)
    if args.json:
        args.json.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
