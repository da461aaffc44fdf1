"""Issue 12's full runs tallied: how often each goal was met, from the runs table.

    python -m bench.runtally [--doc docs/BENCHMARKS.md] [--json PATH]

The hand-written section "Issue 12 at a glance" of ``docs/BENCHMARKS.md`` keeps one row
per ``make bench-hotpath`` run, its figures as the run's report printed them. This reads
that table and computes what the prose under it states: for each goal how many runs met
it and which, each ratio's range and median, the ingest misses beside the runs' raw
COPY, and how the two overhead goals' p50 ratios move together (Pearson, and by rank).
Each goal is judged by the report's own test (:mod:`bench.hotpath_goals`).

A ratio printed at its threshold counts as met: the report rounds to two places, and
the run's verdict judged the unrounded figure, so a cell whose rounding would turn a
miss into a pass carries more digits (12:36's 0.751×, 14:01's 89.7%). A tail cell
without its extra load (the runs before 07:06) is judged on its ratio alone.
"""

from __future__ import annotations

import argparse
import re
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from bench.console import emit
from bench.hotpath_goals import (
    ingest_met,
    one_member_met,
    tail_met,
    throughput_met,
    two_members_met,
)

DOC = Path(__file__).resolve().parent.parent / "docs" / "BENCHMARKS.md"
SECTION = "### Issue 12 at a glance"  # the runs table is the first table after it
ROW = re.compile(r"^\| (\d\d:\d\d) \| `([0-9a-f]{7,40})` \|(.*)\|\s*$")
NUM = r"(\d+(?:\.\d+)?)"  # a figure as the report prints it: digits, a point, digits
COUNT = r"(\d{1,3}(?: \d{3})*)"  # a rate with its thousands set apart by spaces
PAIR = re.compile(rf"^{NUM}× · {NUM}×$")
PERCENTS = re.compile(rf"^{NUM}% · {NUM}%$")
INGEST = re.compile(rf"^{COUNT} \({COUNT}\)$")
TAIL = re.compile(rf"^{NUM}×(?: at {NUM}%)?(?: \(paired {NUM}×\))?$")
# A 1-member p50 ratio at or above this is a run on a fast spell of the machine, where
# bare Celery's round trip shrinks and the 2-member ratio falls: the prose splits there.
FAST_SPELL_ONE_P50 = 0.95


@dataclass(frozen=True)
class Run:
    time: str
    code: str
    one_p50: float  # 1 member's overhead over bare Celery's round trip
    one_p99: float
    two_p50: float  # 2 members' overhead over 1 member's
    two_p99: float
    tasks_one: float  # member tasks/s over bare Celery's, as a fraction
    tasks_two: float
    ingest: float  # traces/s, one harvester
    raw_copy: float  # rows/s, the same run's raw COPY
    tail: float  # p99 over the ideal launch at the run's extra load
    tail_load_pct: float | None
    tail_paired: float | None


def _cell(pattern: re.Pattern[str], cell: str, row: str, what: str) -> re.Match[str]:
    m = pattern.match(cell.strip())
    if m is None:
        raise ValueError(
            f"run {row}: {what} cell {cell.strip()!r} is not of the form {pattern.pattern}"
        )
    return m


def parse_row(line: str) -> Run:
    """One row of the runs table; a ValueError names the run and the cell it could not read."""
    m = ROW.match(line)
    if m is None:
        raise ValueError(f"not a runs-table row: {line!r}")
    time, code, rest = m.groups()
    cells = rest.split("|")
    if len(cells) != 5:
        raise ValueError(f"run {time}: {len(cells) + 2} cells, expected 7")
    one = _cell(PAIR, cells[0], time, "1 member")
    two = _cell(PAIR, cells[1], time, "2 members / 1 member")
    tasks = _cell(PERCENTS, cells[2], time, "tasks/s")
    ingest = _cell(INGEST, cells[3], time, "ingest")
    tail = _cell(TAIL, cells[4], time, "tail")
    return Run(
        time=time,
        code=code,
        one_p50=float(one[1]),
        one_p99=float(one[2]),
        two_p50=float(two[1]),
        two_p99=float(two[2]),
        tasks_one=float(tasks[1]) / 100,
        tasks_two=float(tasks[2]) / 100,
        ingest=float(ingest[1].replace(" ", "")),
        raw_copy=float(ingest[2].replace(" ", "")),
        tail=float(tail[1]),
        tail_load_pct=None if tail[2] is None else float(tail[2]),
        tail_paired=None if tail[3] is None else float(tail[3]),
    )


def read_runs(text: str) -> list[Run]:
    """The runs table of the "at a glance" section, in its order (oldest first)."""
    at = text.find(SECTION)
    if at < 0:
        raise ValueError(f"no section {SECTION!r} in the document")
    runs: list[Run] = []
    for line in text[at:].splitlines():
        if runs and not line.startswith("|"):
            break  # the table's end
        if ROW.match(line):
            runs.append(parse_row(line))
    if not runs:
        raise ValueError(f"no runs table under {SECTION!r}")
    return runs


def verdicts(run: Run) -> dict[str, bool]:
    """Each goal the table carries, judged by the report's own tests."""
    load = None if run.tail_load_pct is None else run.tail_load_pct / 100
    return {
        "one_member": one_member_met(run.one_p50, run.one_p99),
        "two_members": two_members_met(run.two_p50, run.two_p99),
        "tasks": throughput_met(run.tasks_one) and throughput_met(run.tasks_two),
        "ingest": ingest_met(run.ingest),
        "tail": tail_met(run.tail, load),
    }


def ranks(xs: list[float]) -> np.ndarray[Any, np.dtype[np.float64]]:
    """1-based ranks, ties given their average rank (as Spearman's rho takes them)."""
    a = np.asarray(xs, dtype=float)
    order = a.argsort(kind="stable")
    r = np.empty(len(a))
    r[order] = np.arange(1, len(a) + 1)
    for v in np.unique(a):
        tied = a == v
        r[tied] = r[tied].mean()
    return r


def _span(xs: list[float]) -> dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def tally(runs: list[Run]) -> dict[str, Any]:
    """The tallies the prose states, computed from the runs."""
    if not runs:
        raise ValueError("no runs to tally")
    judged = [verdicts(r) for r in runs]
    goals = {
        g: {
            "met": sum(v[g] for v in judged),
            "runs": [r.time for r, v in zip(runs, judged, strict=True) if v[g]],
        }
        for g in judged[0]
    }
    one, two = [r.one_p50 for r in runs], [r.two_p50 for r in runs]
    fast = [r.two_p50 for r in runs if r.one_p50 >= FAST_SPELL_ONE_P50]
    rest = [r.two_p50 for r in runs if r.one_p50 < FAST_SPELL_ONE_P50]
    slowest = sorted(runs, key=lambda r: r.raw_copy)
    misses = [r for r, v in zip(runs, judged, strict=True) if not v["ingest"]]
    return {
        "runs": len(runs),
        "goals": goals,
        "both_overhead_goals": [
            r.time
            for r, v in zip(runs, judged, strict=True)
            if v["one_member"] and v["two_members"]
        ],
        "one_p50": _span(one),
        "two_p50": _span(two),
        "tasks_lower_of_one_two": _span([min(r.tasks_one, r.tasks_two) for r in runs]),
        "harvest_over_raw_copy": _span([r.ingest / r.raw_copy for r in runs]),
        "ingest_misses_raw_copy_rank": [slowest.index(r) + 1 for r in misses],  # 1 = slowest
        "correlation_one_two_p50": {
            "pearson": float(np.corrcoef(one, two)[0, 1]),
            "rank": float(np.corrcoef(ranks(one), ranks(two))[0, 1]),
        },
        "two_p50_by_spell": {
            f"one_p50_at_least_{FAST_SPELL_ONE_P50}": {
                "runs": len(fast),
                **(_span(fast) if fast else {}),
            },
            "other": {"runs": len(rest), **(_span(rest) if rest else {})},
        },
        "rows": [asdict(r) | {"met": v} for r, v in zip(runs, judged, strict=True)],
    }


def _which(met: list[str], every: list[str]) -> str:
    """The runs that met a goal, or those that missed it when they are the fewer."""
    if len(met) * 2 <= len(every):
        return ", ".join(met) or "none"
    missed = [t for t in every if t not in met]
    return "all but " + ", ".join(missed) if missed else "all"


def render(res: dict[str, Any]) -> Table:
    n = res["runs"]
    t = Table(title=f"Issue 12's goals over {n} full runs (the runs table of docs/BENCHMARKS.md)")
    t.add_column("goal")
    t.add_column("met", justify="right")
    t.add_column("runs")
    every = [r["time"] for r in res["rows"]]
    for goal, g in res["goals"].items():
        t.add_row(goal, f"{g['met']} of {n}", _which(g["runs"], every))
    both = res["both_overhead_goals"]
    t.add_row("both overhead goals", f"{len(both)} of {n}", _which(both, every))
    c = res["correlation_one_two_p50"]
    t.caption = (
        f"1 / 2-member p50 ratios correlate at {c['pearson']:.2f} (Pearson), "
        f"{c['rank']:.2f} by rank; 1-member p50 median {res['one_p50']['median']:.3f}×"
    )
    return t


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--doc", type=Path, default=DOC, help="the document holding the runs table")
    ap.add_argument("--json", type=Path, default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    try:
        text = args.doc.read_text()
    except OSError as exc:
        ap.error(f"--doc {args.doc}: {exc.strerror}")
    try:
        res = tally(read_runs(text))
    except ValueError as exc:
        ap.error(f"--doc {args.doc}: {exc}")
    res["command"] = "python -m bench.runtally" + ("" if args.doc == DOC else f" --doc {args.doc}")
    emit(res, render(res), args.json)


if __name__ == "__main__":
    main()
