"""What a plan that finds a new co-failure snapshot spends on its evidence, by pool
size: the snapshot's evidence decoded (``cofailure.decode``: JSON to the pairs'
``PairStats``), encoded (the recompute's side), and the pool's failure domains worked
out (``cofailure.dependence``). The evidence is bench/rtplan.py's: every same-zone pair
of a pool of 6, 24 or 200 candidates across three zones, 20 groups each.

    python -m bench.evidence_codec [--sizes 6,24,200] [--n 30]

Prints JSON (µs, median and p99 over ``--n`` warm calls per part, timed as
bench/rtplan.py times its parts) and a table. Pure: no services; run it on two commits
(``PYTHONPATH=<worktree>``) to compare them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from rich.table import Table

from bench.console import emit
from bench.rtplan import SIZES, plan_pool, timed, zone_cofailure
from coordinator.core import cofailure
from coordinator.core.cofailure import Member, dependence
from coordinator.core.params import ProfileSettings

PARTS = ("decode", "encode", "dependence")


def case(size: int, n: int, seed: int = 0) -> dict[str, Any]:
    cands = plan_pool(size).candidates
    evidence = zone_cofailure(cands, np.random.default_rng(seed))
    text = cofailure.encode(evidence)
    assert cofailure.decode(text).pairs == evidence.pairs
    members = [Member(c.id, c.zone, c.model, "") for c in cands]
    ps = ProfileSettings()
    parts: dict[str, Callable[[], object]] = {
        "decode": lambda: cofailure.decode(text),
        "encode": lambda: cofailure.encode(evidence),
        "dependence": lambda: dependence(members, evidence, ps),
    }
    times = {name: timed(fn, n) for name, fn in parts.items()}
    return {"candidates": size, "pairs": len(evidence.pairs), "bytes": len(text), "times": times}


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.evidence_codec", description=__doc__)
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="pool sizes")
    p.add_argument("--n", type=int, default=30, help="calls per part and size")
    args = p.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        p.error(f"--sizes {args.sizes!r}: expected sizes separated by commas, as 6,24,200")
    if args.n < 1 or any(s < 2 for s in sizes):
        p.error(f"--n {args.n} and --sizes {args.sizes}: expected n >= 1 and sizes >= 2")
    cases = [case(s, args.n) for s in sizes]
    t = Table(title=f"co-failure evidence, µs median / p99 ({args.n} calls per part)")
    t.add_column("part")
    for c in cases:
        t.add_column(f"{c['candidates']} ({c['pairs']} pairs)", justify="right")
    for part in PARTS:
        t.add_row(part, *(f"{c['times'][part]['median_us']:.0f} / "
                          f"{c['times'][part]['p99_us']:.0f}" for c in cases))  # fmt: skip
    emit({"command": "python -m bench.evidence_codec", "cases": cases}, t, None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
