"""bench/hotpath_report.py: the issue-12 block of docs/BENCHMARKS.md, from fixture JSON."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from bench.hotpath_goals import (
    ideal_at,
    overhead_goals,
    tail_call_cost,
    tail_goals,
    throughput_goals,
)
from bench.hotpath_report import BEGIN, END, INPUTS, main
from bench.hotpath_tables import planning_section
from bench.rttail import p99_interval, same_draws

DOC = """# Benchmarks

Every figure here comes from a command under `bench/`.
A second line of the intro.

## Issue 2 — the allocation rule

| pool | median |
| --- | --- |
| 6 | 23.0 µs |
"""

MACHINE = {"cpus": 2, "python": "3.11.9", "time": "2026-12-01T06:00:00+0000",
           "loadavg": [0.1, 0.2, 0.3], "loadavg_after": [0.4, 0.5, 0.6],
           "python_loop_ms": 66.2, "python_loop_ms_after": 93.4}  # fmt: skip


def _pct(p50: float, p99: float) -> dict[str, float]:
    return {"n": 100, "p50_ms": p50, "p90_ms": p50, "p99_ms": p99, "mean_ms": p50, "max_ms": p99}


def _cpu(client: float, worker: float, redis: float, bare: bool = False) -> dict[str, float]:
    return {"client": client, "worker_bare" if bare else "worker_local": worker, "redis": redis}


RUNTIME: dict[str, Any] = {
    "command": "python -m bench.runtime all --json out/bench/runtime.json",
    "machine": MACHINE,
    "redis": {"source": "embedded", "version": "7.2.4"},
    "results": {
        "overhead": {
            "floor_echo": _pct(0.2, 0.5),
            "bare_celery_roundtrip": _pct(2.0, 4.0),
            "haco_1": {"overhead": _pct(1.0, 3.0)},  # 0.5× and 0.75× bare: met
            "haco_2": {"overhead": _pct(1.1, 3.3)},  # 1.1× one member: met
        },
        "throughput": {
            "clients": 32,
            "median_tasks_per_s": {"bare": 1000.0, "haco-1": 950.0, "haco-2": 500.0},
            "cpu_ms_per_task": {
                "bare": _cpu(1.0, 2.0, 0.3, bare=True),
                "haco-1": _cpu(1.5, 2.2, 0.4),  # 1.1× bare: met
                "haco-2": _cpu(1.5, 3.0, 0.4),  # 1.5× bare: not met
            },
        },
        "tail": {
            "variants": {"staggered-p95-b5": {"p99_ms": 77.0, "extra_load": 0.045}},
            "offline_staggered_curve": [
                {"percentile": 90, "delay_ms": 30.0, "extra_load": 0.10, "p99_ms": 50.0},
                {"percentile": 95, "delay_ms": 60.0, "extra_load": 0.05, "p99_ms": 70.0},
                {"percentile": 96, "delay_ms": 70.0, "extra_load": 0.04, "p99_ms": 80.0},
            ],
        },
    },
}


def _point(level: int, scale: float) -> dict[str, Any]:
    def system(tps: float, over: bool) -> dict[str, Any]:
        s: dict[str, Any] = {
            "tasks_per_s": tps * scale,
            "latency": _pct(level * 1.0, level * 2.0),
            "cpu_ms_per_task": {"client": 1.0, "worker": 2.0, "redis": 0.5},
            "busy_cores": {"client": 0.5, "worker": 0.9, "redis": 0.2},
            "n_errors": 0,
        }
        if over:
            s["overhead"] = _pct(level * 0.5, level * 1.5)
            s["ratio_to_bare"] = tps / 600.0
        return s

    return {"inflight": level, "systems": {"bare": system(600.0, False),
            "haco-1": system(250.0, True), "haco-2": system(300.0, True)}}  # fmt: skip


def _plan_case(n: int) -> dict[str, Any]:
    parts = ("profiles", "build_view", "view", "decide", "decide_with_domains", "plan")
    times = {p: {"median_us": 10.0 * n, "p99_us": 20.0 * n, "n": 50} for p in parts}
    return {"candidates": n, "times": times, "hedge_size": 3, "hedge_size_with_domains": 4,
            "dependence_once_us": 5.0 * n}  # fmt: skip


GROWTH: dict[str, Any] = {
    "command": "python -m bench.runtime growth planning --json out/bench/growth.json",
    "machine": MACHINE,
    "redis": {"source": "embedded", "version": "7.2.4"},
    "results": {
        "growth": {
            "cpus": 2,
            "concurrency": 16,
            "points": [_point(1, 1.0), _point(8, 1.5), _point(32, 1.52)],
            "bends": {
                "bare": None,
                "haco-2": None,
                "haco-1": {
                    "from": 8,
                    "to": 32,
                    "gain": 0.01,
                    "busiest": "worker",
                    "busiest_cores": 0.97,
                    "total_cores": 1.9,
                },
            },
        },
        "planning": {
            "iters": 50,
            "cases": [_plan_case(6), _plan_case(200)],
            "bend": {
                "size_growth": 33.3,
                "time_growth": dict.fromkeys(
                    ("profiles", "build_view", "view", "decide", "decide_with_domains", "plan"),
                    33.3,
                ),
                "share_of_plan_at_largest": {"profiles": 0.7, "build_view": 0.1, "decide": 0.05},
            },
        },
    },
}


def _ingest(harvesters: int, tps: float) -> dict[str, Any]:
    return {
        "n": 200000, "batch": 5000, "harvesters": harvesters, "cpus": 2,
        "raw_copy": {"seconds": 2.0, "rows_per_s": 100000.0},
        "stream_push": {"seconds": 2.0, "entries_per_s": 90000.0},
        "harvest": {"seconds": 200000 / tps, "traces_per_s": tps, "rows_stored": 200000,
                    "batches": 40, "max_oldest_pending_age_s": 0.5, "max_stream_len": 195000,
                    "max_oldest_entry_age_s": 4.0},
        "harvest_vs_raw_copy": tps / 100000.0, "metrics": {},
    }  # fmt: skip


def _write(tmp: Path, runtime: dict[str, Any], ingest_tps: float = 22332.0) -> list[str]:
    files = {"runtime": runtime, "growth": GROWTH, "ingest": _ingest(1, ingest_tps),
             "ingest2": _ingest(2, 46279.0)}  # fmt: skip
    args = []
    for name, data in files.items():
        path = tmp / f"{name}.json"
        path.write_text(json.dumps(data), encoding="utf-8")
        args += [f"--{name}", str(path)]
    for name in set(INPUTS) - set(files):  # not measured here, whatever out/bench holds
        args += [f"--{name}", str(tmp / f"absent-{name}.json")]
    return [*args, "--doc", str(tmp / "BENCHMARKS.md")]


def _block(doc: str) -> str:
    return doc.split(BEGIN, 1)[1].split(END, 1)[0]


def _without_block(doc: str) -> str:
    head, rest = doc.split("\n" + BEGIN, 1)
    return head + rest.split(END + "\n", 1)[1]


def _row(block: str, start: str) -> str:
    return next(line for line in block.splitlines() if line.startswith(f"| {start}"))


def _report_without(tmp: Path, text: str) -> Path:
    """The report written from the base runtime JSON, which lacks what ``text`` names: the
    row's absence asserted, and the document returned for the measured run to rewrite."""
    doc = tmp / "BENCHMARKS.md"
    doc.write_text(DOC, encoding="utf-8")
    main(_write(tmp, RUNTIME))
    assert text not in _block(doc.read_text(encoding="utf-8"))
    return doc


def test_markers_go_after_the_intro_once_and_the_rest_is_untouched(tmp_path: Path) -> None:
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text(DOC, encoding="utf-8")
    assert main(_write(tmp_path, RUNTIME)) == 0
    text = doc.read_text(encoding="utf-8")
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    assert text.index("A second line of the intro.") < text.index(BEGIN)
    assert text.index(END) < text.index("## Issue 2")
    assert _without_block(text) == DOC
    block = _block(text)
    assert "python -m bench.runtime all --json out/bench/runtime.json" in block
    assert "python -m bench.ingest --n 200000 --batch 5000 --harvesters 2" in block
    assert "2026-12-01T06:00:00+0000" in block and "7.2.4 (embedded)" in block
    assert "0.10 0.20 0.30 → 0.40 0.50 0.60 | 66 → 93 |" in block  # the VM's speed, too


def test_a_second_run_replaces_the_block_and_nothing_else(tmp_path: Path) -> None:
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text(DOC, encoding="utf-8")
    main(_write(tmp_path, RUNTIME, ingest_tps=22332.0))
    first = doc.read_text(encoding="utf-8")
    main(_write(tmp_path, RUNTIME, ingest_tps=61000.0))
    second = doc.read_text(encoding="utf-8")
    assert second.count(BEGIN) == 1 and second.count(END) == 1
    assert _without_block(second) == DOC
    assert "22 332" in _block(first) and "22 332" not in _block(second)
    assert "61 000" in _row(_block(second), "trace ingest")
    assert "✔ met" in _row(_block(second), "trace ingest")
    assert "✘ not met" in _row(_block(first), "trace ingest")


def test_the_verdicts_follow_the_numbers(tmp_path: Path) -> None:
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text(DOC, encoding="utf-8")
    main(_write(tmp_path, RUNTIME))
    block = _block(doc.read_text(encoding="utf-8"))
    assert "✔ met" in _row(block, "dispatch overhead, 1 member")
    assert "✔ met" in _row(block, "dispatch overhead, 2 members")
    assert "✔ met" in _row(block, "member tasks/s, 32 groups in flight, HACO, 1 member")
    assert "✘ not met" in _row(block, "member tasks/s, 32 groups in flight, HACO, 2 members")
    assert "✔ met" in _row(block, "worker CPU ms per member task, HACO, 1 member")
    assert "✘ not met" in _row(block, "worker CPU ms per member task, HACO, 2 members")
    tail = _row(block, "staggered tail")
    assert "75.0" in tail and "✔ met" in tail  # ideal 75 ms at 4.5 %: 77 / 75 = 1.03

    slower = copy.deepcopy(RUNTIME)
    slower["results"]["overhead"]["haco_1"]["overhead"] = _pct(1.6, 3.0)  # 0.8× bare p50
    slower["results"]["tail"]["variants"]["staggered-p95-b5"]["extra_load"] = 0.06
    main(_write(tmp_path, slower))
    block = _block(doc.read_text(encoding="utf-8"))
    assert "✘ not met" in _row(block, "dispatch overhead, 1 member")
    assert "✘ not met" in _row(block, "staggered tail")  # more than 5 % extra load


def test_two_members_in_two_zones_are_shown_beside_the_goal_not_judged(tmp_path: Path) -> None:
    doc = _report_without(tmp_path, "in two zones")  # not measured: no row
    zones = copy.deepcopy(RUNTIME)
    zones["results"]["overhead"]["haco_2_zones"] = {"overhead": _pct(1.5, 3.6)}
    assert overhead_goals(zones["results"]["overhead"])["haco_2"] is True  # unchanged
    main(_write(tmp_path, zones))
    row = _row(_block(doc.read_text(encoding="utf-8")), "… the 2 members in two zones")
    assert "1.50 / 3.60" in row and "1.50× · 1.20× of 1 member" in row
    assert "met" not in row


def test_one_members_latency_less_its_draw_is_shown_beside_the_goal_not_judged(
    tmp_path: Path,
) -> None:
    doc = _report_without(tmp_path, "less the backend's draw alone")
    res = copy.deepcopy(RUNTIME)
    res["results"]["overhead"]["haco_1"]["beyond_draw"] = _pct(1.8, 3.6)
    assert overhead_goals(res["results"]["overhead"]) == overhead_goals(
        RUNTIME["results"]["overhead"]
    )  # the goal's verdict unchanged
    main(_write(tmp_path, res))
    row = _row(_block(doc.read_text(encoding="utf-8")), "… 1 member, its group's latency")
    assert "1.80 / 3.60" in row and "0.90× · 0.90× of bare" in row
    assert "met" not in row


def _stamps() -> dict[str, Any]:
    ratios = {
        "one_less_own_over_bare_p50": 0.8, "one_less_own_over_bare_p99": 0.9,
        "one_less_backend_over_bare_p50": 1.05, "one_less_backend_over_bare_p99": 1.2,
        "two_over_one_less_own_p50": 1.46, "two_over_one_less_own_p99": 1.25,
        "two_over_one_less_backend_p50": 1.39, "two_over_one_less_backend_p99": 1.2,
    }  # fmt: skip
    return {
        "n": 1000, "rounds": 10, "bare_roundtrip": _pct(1.2, 2.5), "ratios": ratios,
        "haco_1": {"missing": 0, "less_own": _pct(0.96, 2.25), "less_backend": _pct(1.26, 3.0)},
        "haco_2": {"missing": 0}, "command": "python -m bench.memberstamps",
    }  # fmt: skip


def test_the_calls_less_the_backends_call_are_shown_beside_the_goal_not_judged(
    tmp_path: Path,
) -> None:
    doc = _report_without(tmp_path, "less the backend's call alone")
    stamps = tmp_path / "stamps.json"
    stamps.write_text(json.dumps(_stamps()), encoding="utf-8")
    args = _write(tmp_path, RUNTIME)
    main([*args[:-2], "--memberstamps", str(stamps), *args[-2:]])
    block = _block(doc.read_text(encoding="utf-8"))
    row = _row(block, "… 1 member, its group's latency less the backend's call alone")
    assert "**1.26 / 3.00**" in row and "round trip 1.20 / 2.50" in row
    assert "1.05× · 1.20× of bare (the goals' count there: 0.80× · 0.90×)" in row
    assert "2 / 1 member 1.39× · 1.20× (the goals' count there: 1.46× · 1.25×)" in row
    assert "met" not in row
    assert "`python -m bench.memberstamps`" in _row(block, "memberstamps")
    # A run without 2-member ratios (no call of them kept) still renders, with dashes.
    partial = _stamps()
    partial["ratios"] = {k: v for k, v in partial["ratios"].items() if k.startswith("one_")}
    stamps.write_text(json.dumps(partial), encoding="utf-8")
    main([*args[:-2], "--memberstamps", str(stamps), *args[-2:]])
    row = _row(
        _block(doc.read_text(encoding="utf-8")),
        "… 1 member, its group's latency less the backend's call",
    )
    assert "2 / 1 member — · — (the goals' count there: — · —)" in row


def test_one_tail_call_beside_bare_celery_is_shown_beside_the_goal_not_judged(
    tmp_path: Path,
) -> None:
    doc = _report_without(tmp_path, "one call there")  # no bare calls in the tail: no row
    res = copy.deepcopy(RUNTIME)
    variants = res["results"]["tail"]["variants"]
    variants["none"] = {"runtime_cost": _pct(1.8, 3.7), "beyond_draw": _pct(2.6, 4.8)}
    variants["bare Celery"] = {"runtime_cost": _pct(2.0, 3.4), "beyond_draw": _pct(2.0, 4.0)}
    cost = tail_call_cost(res["results"]["tail"])
    assert cost is not None
    assert cost["beyond_draw"]["p50_over_bare"] == pytest.approx(1.3)
    assert cost["runtime_cost"]["p50_over_bare"] == pytest.approx(0.9)
    before = tail_goals(RUNTIME["results"]["tail"])
    assert tail_goals(res["results"]["tail"]) == before  # the goal's verdict unchanged
    main(_write(tmp_path, res))
    row = _row(_block(doc.read_text(encoding="utf-8")), "… one call there")
    assert "2.60 / 4.80" in row and "2.00 / 4.00" in row
    assert "1.30× · 1.20× of bare" in row
    assert "met" not in row


def test_goal_arithmetic() -> None:
    ov = overhead_goals(RUNTIME["results"]["overhead"])
    assert ov["overhead_p50_over_bare_p50"] == pytest.approx(0.5)
    assert ov["two_over_one_p99"] == pytest.approx(1.1)
    tp = throughput_goals(RUNTIME["results"]["throughput"])
    assert tp["haco-1"]["throughput_ratio"] == pytest.approx(0.95)
    assert tp["haco-2"]["worker_cpu_over_bare"] == pytest.approx(1.5)
    curve = RUNTIME["results"]["tail"]["offline_staggered_curve"]
    assert ideal_at(curve, 0.045) == pytest.approx(75.0)
    assert ideal_at(curve, 0.01) == pytest.approx(80.0)  # nearest not-smaller extra load
    assert ideal_at(curve, 0.5) == pytest.approx(50.0)
    assert ideal_at([], 0.05) is None
    assert tail_goals(RUNTIME["results"]["tail"])["p99_over_ideal"] == pytest.approx(77 / 75)


def test_tail_goal_splits_the_ratio_into_policy_and_runtime(tmp_path: Path) -> None:
    res = copy.deepcopy(RUNTIME)
    v = res["results"]["tail"]["variants"]["staggered-p95-b5"]
    v.update(n=6000, p99_ms_ci90=[75.0, 82.5], same_draws={"p99_ms": 76.5})
    g = tail_goals(res["results"]["tail"])
    assert g["p99_over_ideal_ci90"] == pytest.approx([1.0, 1.1])
    assert g["same_draws_over_ideal"] == pytest.approx(76.5 / 75)  # the policy's share
    assert g["runtime_over_same_draws"] == pytest.approx(77 / 76.5)  # the runtime's
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text(DOC, encoding="utf-8")
    main(_write(tmp_path, res))
    row = _row(_block(doc.read_text(encoding="utf-8")), "staggered tail")
    assert "90% interval 1.00×–1.10× over 6000 calls" in row
    assert "policy 1.02×, runtime 1.01×" in row
    assert "paired" not in _block(doc.read_text(encoding="utf-8"))  # an older run: no row


def test_the_ideal_on_the_runs_own_draws_is_shown_beside_the_tail_goal_not_judged(
    tmp_path: Path,
) -> None:
    res = copy.deepcopy(RUNTIME)
    v = res["results"]["tail"]["variants"]["staggered-p95-b5"]
    v["paired_ideal"] = {"p99_ms": 74.0, "delay_ms": 21.5, "filled": 3, "unpaired": 0,
                         "p99_over": 77 / 74, "p99_over_ci90": [1.01, 1.06],
                         "same_draws_over": 1.02}  # fmt: skip
    g = tail_goals(res["results"]["tail"])
    assert g["paired"] == v["paired_ideal"]
    assert {k: g[k] for k in g if k != "paired"} == {
        k: val for k, val in tail_goals(RUNTIME["results"]["tail"]).items() if k != "paired"
    }  # the verdict and its figures as before
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text(DOC, encoding="utf-8")
    main(_write(tmp_path, res))
    row = _row(_block(doc.read_text(encoding="utf-8")), "… against the ideal launch")
    assert "74.0" in row and "delay 21.5 ms; 3 backups drawn afresh" in row
    assert "1.04×; 90% interval 1.01×–1.06×; policy 1.02×" in row
    assert "met" not in row
    assert "backend's draws" not in row  # an older report: no split of the policy's share
    v["paired_ideal"] |= {"draws_over": 1.01, "draws_paid_over": 0.99}
    v["refused"] = {"budget": 12, "over_delay": 10}
    doc.write_text(DOC, encoding="utf-8")
    main(_write(tmp_path, res))
    row = _row(_block(doc.read_text(encoding="utf-8")), "… against the ideal launch")
    assert "policy 1.02× (1.01× on the backend's draws, 0.99× with the budget's 12 " in row


def test_same_draws_take_each_call_at_its_members_own_latencies() -> None:
    def m(rank: int, start: float, end: float, status: str = "succeeded") -> dict[str, Any]:
        return {"rank": rank, "started_at_s": start, "finished_at_s": end, "status": status}

    traces = {
        "a": [m(0, 10.0, 10.30), m(1, 10.1, 10.12)],  # the backup, 20 ms, after 100 ms
        "b": [m(0, 5.0, 5.004), m(1, 5.0, 5.5, "cancelled")],
        "c": [m(0, 1.0, 1.2, "failed")],  # no success: the measured latency stays
    }
    calls = [("a", 0.1), ("b", 0.1), ("c", 0.1)]
    staggered = same_draws(calls, [0.125, 0.006, 0.3], traces, staggered=True)
    assert staggered == pytest.approx([0.12, 0.004, 0.3])
    parallel = same_draws(calls, [0.125, 0.006, 0.3], traces, staggered=False)
    assert parallel[0] == pytest.approx(0.02)  # both at once: the faster draw
    lo, hi = p99_interval([0.001 * i for i in range(1, 1001)])
    assert lo < 990.0 < hi  # the p99 of 1..1000 ms lies inside its interval


def test_missing_inputs_render_as_not_measured_and_a_placeholder(tmp_path: Path) -> None:
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text(DOC, encoding="utf-8")
    missing = str(tmp_path / "nope.json")
    args = ["--runtime", missing, "--growth", missing, "--ingest", missing, "--ingest2", missing]
    assert main([*args, "--doc", str(doc)]) == 0
    assert "not measured" in _block(doc.read_text(encoding="utf-8"))
    main(["--placeholder", "Generated by `make bench-hotpath`.", "--doc", str(doc)])
    text = doc.read_text(encoding="utf-8")
    assert "Generated by `make bench-hotpath`." in _block(text)
    assert "not measured" not in text and _without_block(text) == DOC


def _busy(harvesters: float, postgres: float | None, machine: float) -> dict[str, Any]:
    return {"harvesters": harvesters, "postgres": postgres, "redis": 0.2, "machine": machine}


@pytest.mark.parametrize(
    ("one", "two", "why"),
    [
        (_busy(0.55, 0.7, 1.5), _busy(0.9, 0.8, 1.9), "cores are nearly all busy"),
        (_busy(0.85, 0.3, 1.3), _busy(1.2, 0.3, 1.5), "the ceiling of one Python process"),
        (_busy(0.3, 0.4, 0.9), _busy(0.5, None, 1.0), "the harvesters wait"),
    ],
)
def test_the_ingest_bend_says_what_the_drain_kept_busy(
    tmp_path: Path, one: dict[str, Any], two: dict[str, Any], why: str
) -> None:
    args = _write(tmp_path, RUNTIME, ingest_tps=40000.0)
    for name, busy in (("ingest", one), ("ingest2", two)):
        path = Path(args[args.index(f"--{name}") + 1])
        path.write_text(json.dumps({**json.loads(path.read_text()), "busy_cores": busy}))
    (tmp_path / "BENCHMARKS.md").write_text(DOC, encoding="utf-8")
    main(args)
    block = _block((tmp_path / "BENCHMARKS.md").read_text(encoding="utf-8"))
    bend = next(line for line in block.splitlines() if line.startswith("From 1 to 2 harvesters"))
    # 46 279 against 40 000 traces/s; the fixtures' raw COPY is the same in both runs.
    assert bend.startswith("From 1 to 2 harvesters the traces/s go ×1.16 (40% → 46% ")
    assert "raw COPY, which itself went ×1.00" in bend and why in bend
    assert f"the harvesters {one['harvesters']:.2f} → {two['harvesters']:.2f}" in bend
    pg = "not on this machine" if two["postgres"] is None else f"{one['postgres']:.2f} →"
    assert f"Postgres {pg}" in bend
    cells = [f"{b['harvesters']:.2f} · " for b in (one, two)]
    assert all(c in _row(block, "busy cores while draining") for c in cells)


def test_without_busy_cores_the_ingest_has_no_bend_and_dashes(tmp_path: Path) -> None:
    (tmp_path / "BENCHMARKS.md").write_text(DOC, encoding="utf-8")
    main(_write(tmp_path, RUNTIME))  # runs from before bench.ingest counted them
    block = _block((tmp_path / "BENCHMARKS.md").read_text(encoding="utf-8"))
    assert "From 1 to 2 harvesters" not in block
    assert _row(block, "busy cores while draining").endswith("| — | — |")


def test_two_members_settled_are_shown_beside_the_goal_with_what_did_not_settle(
    tmp_path: Path,
) -> None:
    doc = _report_without(tmp_path, "waiting for its loser")  # not measured: no row
    settled = copy.deepcopy(RUNTIME)
    ov = settled["results"]["overhead"]
    ov["haco_2_settled"] = {"overhead": _pct(1.3, 3.9), "unsettled_calls": 0}
    goals = overhead_goals(ov)
    assert goals["haco_2"] is True  # the goal is judged on the calls that do not wait
    assert goals["two_settled_over_one_p50"] == pytest.approx(1.3)
    main(_write(tmp_path, settled))
    row = _row(_block(doc.read_text(encoding="utf-8")), "… the 2 members, each call waiting")
    assert "1.30 / 3.90" in row and "1.30× · 1.30× of 1 member" in row
    assert "met" not in row and "not settled" not in row
    assert "of bare Celery's 2 tasks" not in row  # bare's 2-task calls not measured
    ov["haco_2_settled"]["unsettled_calls"] = 3
    ov["bare_celery_1_task"], ov["bare_celery_2_tasks"] = _pct(1.0, 2.0), _pct(1.3, 3.0)
    main(_write(tmp_path, settled))
    row = _row(_block(doc.read_text(encoding="utf-8")), "… the 2 members, each call waiting")
    assert "(3 calls not settled in time)" in row
    assert "1.00× · 1.30× of bare Celery's 2 tasks" in row  # like for like: both wait


def test_the_planning_table_shows_the_evidence_decoded_only_when_measured() -> None:
    cases = [_plan_case(6), _plan_case(200)]
    older = "\n".join(planning_section({"cases": cases}))
    assert "failure domains worked out, once per snapshot | 30 | 1 000 |" in older
    assert "evidence decoded" not in older  # a run before the row existed
    for c, us, pairs in zip(cases, (2.4, 4012.6), (3, 6567), strict=True):
        c |= {"evidence_decode_once_us": us, "evidence_pairs": pairs}
    text = "\n".join(planning_section({"cases": cases}))
    row = "the snapshot's co-failure evidence decoded, once per snapshot (pairs) |"
    assert f"{row} 2 (3) | 4 013 (6 567) |" in text


def test_the_planning_table_shows_the_plan_after_a_snapshot_only_when_measured() -> None:
    cases = [_plan_case(6), _plan_case(200)]
    assert "right after a new snapshot" not in "\n".join(planning_section({"cases": cases}))
    for c, (worked, published) in zip(cases, ((2308.1, 1606.3), (28462.5, 9149.8)), strict=True):
        c["after_snapshot"] = {"worked_out_us": worked, "published_us": published}
    text = "\n".join(planning_section({"cases": cases}))
    row = "`Coordinator._plan` right after a new snapshot, its pool's domains"
    assert f"{row} worked out from the evidence (as before) | 2 308 | 28 462 |" in text
    assert f"{row} as the snapshot publishes them | 1 606 | 9 150 |" in text
