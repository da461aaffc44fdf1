"""Import cost of HACO's entry points, each in a fresh interpreter: the SDK (the client
import), a worker (``import workers.app``), the pure core (the allocation policy) and the
CLI module.

    python -m bench.imports [--before PATH] [--tree PATH] [--repeat N] [--top N]

Every run is ``python -P -c`` (no script directory on ``sys.path``) with ``PYTHONPATH``
set to the tree alone, so the tree's packages come before an editable install of
another checkout; the child reports where ``coordinator`` came from (checked against the
tree), the time of the import statement itself (``perf_counter`` around it), and the
modules loaded. Per case: the median import time, the median process wall time minus the
bare interpreter's (same probe, statement ``pass``), the module count, and which heavy
modules were loaded (matplotlib, the discrete-event engine and runner, celery, redis,
psycopg, numpy). ``--before PATH`` measures another tree side by side (the flat layout
of commit 1af3c4e, or the package layout, is recognised), the runs of both trees and all
cases interleaved; one untimed run per case first compiles the bytecode. ``--top N``
adds one ``-X importtime`` run per case and lists the N top-level packages with the most
self time. One JSON object on stdout, tables on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.console import err, show

TIMEOUT_S = 120.0
# A heavy dependency -> the module names it has had (the engine moved from workers.sim).
WATCH: dict[str, tuple[str, ...]] = {
    "matplotlib": ("matplotlib",),
    "sim.engine": ("sim.engine", "workers.sim.engine"),
    "sim.runner": ("sim.runner", "workers.sim.runner"),
    "celery": ("celery",),
    "redis": ("redis",),
    "psycopg": ("psycopg",),
    "numpy": ("numpy",),
}
# The child: only builtin modules are imported before the statement is timed.
PROBE = """\
import sys, time
_t0 = time.perf_counter()
{statement}
_t1 = time.perf_counter()
import json, coordinator
print(json.dumps({{"import_s": _t1 - _t0, "coordinator": coordinator.__file__,
                  "modules": sorted(sys.modules)}}))
"""


@dataclass(frozen=True)
class Case:
    name: str
    statement: str


def cases_for(tree: Path) -> list[Case]:
    """The entry points' import statements in this tree's layout: the package layout
    (coordinator/{core,runtime,cli}/) or the flat one before it (commit 1af3c4e)."""
    if (tree / "coordinator" / "runtime" / "client.py").is_file():
        client, core, cli = (
            "from coordinator import HacoClient",
            "import coordinator.core.policy",
            "import coordinator.cli.main",
        )
    elif (tree / "coordinator" / "client.py").is_file():
        client, core, cli = (
            "from coordinator.client import HacoClient",
            "import coordinator.policy",
            "import coordinator.cli",
        )
    else:
        raise SystemExit(f"{tree}: no coordinator package of a known layout")
    return [
        Case("client", client),
        Case("worker", "import workers.app"),
        Case("core", core),
        Case("cli", cli),
    ]


@dataclass(frozen=True)
class Tree:
    label: str
    path: Path
    cases: list[Case]

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONSTARTUP"}}
        return {**env, "PYTHONPATH": str(self.path)}


@dataclass(frozen=True)
class Run:
    import_s: float
    wall_s: float
    modules: list[str]


def _child(tree: Tree, statement: str, *flags: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-P", *flags, "-c", PROBE.format(statement=statement)]
    return subprocess.run(
        cmd, env=tree.env(), capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )


def run_once(tree: Tree, statement: str) -> Run:
    t0 = time.perf_counter()
    proc = _child(tree, statement)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{tree.label}: `{statement}` failed:\n{proc.stderr.strip()}")
    out = json.loads(proc.stdout)
    where = Path(out["coordinator"]).resolve()
    if not where.is_relative_to(tree.path):
        raise SystemExit(f"{tree.label}: coordinator came from {where}, not {tree.path}")
    return Run(float(out["import_s"]), wall, list(out["modules"]))


def top_packages(tree: Tree, statement: str, n: int) -> list[tuple[str, float]]:
    """The n top-level packages with the most self time under ``-X importtime`` (ms)."""
    proc = _child(tree, statement, "-X", "importtime")
    self_us: dict[str, int] = {}
    for line in proc.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) != 3 or not parts[0].strip().isdigit():
            continue  # the header, or not an importtime line
        top = parts[2].strip().split(".")[0]
        self_us[top] = self_us.get(top, 0) + int(parts[0])
    ranked = sorted(self_us.items(), key=lambda kv: -kv[1])[:n]
    return [(name, us / 1000) for name, us in ranked]


def loaded(modules: list[str]) -> list[str]:
    present = set(modules)
    return [name for name, aliases in WATCH.items() if present.intersection(aliases)]


def _ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 1)


def measure(trees: list[Tree], repeat: int, top: int) -> dict[str, Any]:
    plan = {tree.label: [Case("bare", "pass"), *tree.cases] for tree in trees}
    for tree in trees:  # bytecode compiled, files cached: untimed
        for case in plan[tree.label]:
            run_once(tree, case.statement)
    runs: dict[tuple[str, str], list[Run]] = {}
    for _ in range(repeat):
        for i in range(len(plan[trees[0].label])):
            for tree in trees:
                case = plan[tree.label][i]
                runs.setdefault((tree.label, case.name), []).append(run_once(tree, case.statement))
    report: dict[str, Any] = {}
    for tree in trees:
        bare = _ms([r.wall_s for r in runs[tree.label, "bare"]])
        cases: dict[str, Any] = {}
        for case in tree.cases:
            rs = runs[tree.label, case.name]
            cases[case.name] = {
                "statement": case.statement,
                "import_ms": _ms([r.import_s for r in rs]),
                "import_ms_runs": [round(r.import_s * 1000, 1) for r in rs],
                "wall_minus_bare_ms": round(_ms([r.wall_s for r in rs]) - bare, 1),
                "modules": len(rs[0].modules),
                "loaded": loaded(rs[0].modules),
            }
            if top:
                cases[case.name]["top_self_ms"] = dict(top_packages(tree, case.statement, top))
        report[tree.label] = {"path": str(tree.path), "bare_wall_ms": bare, "cases": cases}
    return report


def tables(report: dict[str, Any], top: int) -> None:
    t = Table(title="Import cost (median of the runs; fresh interpreter each)")
    for col in ("case", "tree", "statement", "import ms", "wall − bare ms", "modules"):
        t.add_column(col, justify="left" if col in {"case", "tree", "statement"} else "right")
    t.add_column("heavy modules loaded")
    names = list(next(iter(report.values()))["cases"])
    for name in names:
        for label, tr in report.items():
            c = tr["cases"][name]
            t.add_row(
                name,
                label,
                c["statement"],
                f"{c['import_ms']:.1f}",
                f"{c['wall_minus_bare_ms']:.1f}",
                str(c["modules"]),
                ", ".join(c["loaded"]) or "—",
            )
        t.add_section()
    show(t)
    if top:
        tt = Table(title=f"Top {top} packages by self time (-X importtime, one run, ms)")
        for col in ("case", "tree", "packages"):
            tt.add_column(col)
        for name in names:
            for label, tr in report.items():
                pk = tr["cases"][name]["top_self_ms"]
                tt.add_row(name, label, ", ".join(f"{p} {ms:.0f}" for p, ms in pk.items()))
        show(tt)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = Path(__file__).resolve().parents[1]
    p.add_argument("--tree", type=Path, default=here, help="the tree to measure (this one)")
    p.add_argument("--before", type=Path, help="another tree, measured side by side")
    p.add_argument("--repeat", type=int, default=7, help="timed runs per case (default 7)")
    p.add_argument("--top", type=int, default=0, help="list the N packages with most self time")
    args = p.parse_args(argv)
    if args.repeat < 1 or args.top < 0:
        p.error("--repeat must be at least 1 and --top at least 0")
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    paths = {"after" if args.before else "current": args.tree}
    if args.before is not None:
        paths = {"before": args.before, **paths}
    trees = [Tree(label, p.resolve(), cases_for(p.resolve())) for label, p in paths.items()]
    if len({len(t.cases) for t in trees}) != 1:
        raise SystemExit("the trees have different cases")
    err.print(f"{args.repeat} runs per case, interleaved across {[t.label for t in trees]}")
    report = {
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg": list(os.getloadavg()),
            "python": sys.version.split()[0],
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
        "repeat": args.repeat,
        "trees": measure(trees, args.repeat, args.top),
    }
    tables(report["trees"], args.top)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
