"""Markdown tables of bench/hotpath_report.py: growth, CPU per task, planning, ingest and
the machine, each from one benchmark JSON; a missing one renders as "not measured"."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench.hotpath_goals import worker_cpu
from coordinator.core.smallpool import SMALL_POOL

NA = "not measured"
# Busy cores at which a process (of one) or the machine (of its cores) counts as full, in
# the "why" of a curve's bend: CPU s per wall s reads a little low over a run's pauses.
NEAR_FULL = 0.8
SYSTEMS = (("haco-1", "HACO, 1 member"), ("haco-2", "HACO, 2 members"), ("bare", "bare Celery"))
PLAN_PARTS = (
    ("profiles", "the plan's profile read (unchanged profiles cached)"),
    ("profiles_uncached", "every profile read and decoded (`load_profiles`)"),
    ("build_view", "view built from the profiles"),
    ("view", "`Coordinator.view` (on a view read < plan_view_fresh_s ago)"),
    ("decide", "`Haco.decide` (the allocation rule, every term in numpy)"),
    ("choose", f"`Haco.choose` (the rule as a plan runs it: floats up to {SMALL_POOL} candidates)"),
    ("in_floats", "the rule in floats (`smallpool.in_floats`), at any size"),
    ("decide_with_domains", "`Haco.decide` with failure domains"),
    (
        "decide_with_domains_new_view",
        "… on a view new since a profile changed (its fixed terms and joint model worked out)",
    ),
    ("plan_read", "`Coordinator._plan`, reading the view (all of planning)"),
    ("plan", "`Coordinator._plan` on a view read < plan_view_fresh_s ago (no read)"),
)

Json = Mapping[str, Any]


# ---------------------------------------------------------------- formatting


def num(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{x:,.{digits}f}".replace(",", " ")


def met(v: bool | None) -> str:
    return NA if v is None else ("✔ met" if v else "✘ not met")


def times(r: float | None) -> str:
    return "—" if r is None else f"{r:.2f}×"


def span(ci: Sequence[float] | None) -> str:
    """A ratio's interval, as ``0.74×–0.85×``; "—" when not measured."""
    return "—" if ci is None else f"{times(ci[0])}–{times(ci[1])}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def results(report: Json | None, name: str) -> Json | None:
    if report is None:
        return None
    res = report.get("results", {}).get(name)
    return res if isinstance(res, Mapping) else None


# ---------------------------------------------------------------- sections


def _cpu_cell(cpu: Json | None) -> str:
    if not cpu:
        return "—"
    return " · ".join(num(cpu.get(p)) for p in ("client", "worker", "redis"))


def cpu_section(tp: Json | None, growth: Json | None) -> list[str]:
    """CPU ms per member task, client · worker · Redis, per system and load."""
    header = ["system"]
    cols: list[Json] = []
    if tp is not None:
        header.append(f"throughput bench, {tp['clients']} in flight")
        cols.append(
            {
                k: {"client": v["client"], "worker": worker_cpu(tp, k), "redis": v["redis"]}
                for k, v in tp["cpu_ms_per_task"].items()
            }
        )
    for pt in (growth or {}).get("points", []):
        header.append(f"growth, {pt['inflight']} in flight")
        cols.append({k: v["cpu_ms_per_task"] for k, v in pt["systems"].items()})
    if not cols:
        return [NA]
    rows = [[label, *(_cpu_cell(c.get(key)) for c in cols)] for key, label in SYSTEMS]
    return table(header, rows)


def growth_section(growth: Json | None) -> list[str]:
    if growth is None:
        return [NA]
    rows = []
    for pt in growth["points"]:
        for key, label in SYSTEMS:
            v = pt["systems"].get(key)
            if v is None:
                continue
            o, lat, busy = v.get("overhead"), v["latency"], v["busy_cores"]
            ratio = v.get("ratio_to_bare")
            rows.append(
                [
                    str(pt["inflight"]),
                    label,
                    num(v["tasks_per_s"], 0),
                    "—" if ratio is None else f"{ratio:.0%}",
                    f"{num(lat['p50_ms'])} / {num(lat['p99_ms'])}",
                    "—" if o is None else f"{num(o['p50_ms'])} / {num(o['p99_ms'])}",
                    _cpu_cell(busy),
                    str(v["n_errors"]),
                ]
            )
    header = ["in flight", "system", "tasks/s", "vs bare", "group latency p50 / p99 ms"]
    header += ["overhead p50 / p99 ms", "busy cores: client · worker · Redis", "errors"]
    out = table(header, rows)
    out += ["", *bend_lines(growth)]
    return out


def bend_lines(growth: Json) -> list[str]:
    cores = growth.get("cpus") or 1
    conc = growth.get("concurrency")
    out = []
    for key, label in SYSTEMS:
        b = growth.get("bends", {}).get(key)
        if b is None:
            out.append(f"- {label}: tasks/s still grow by ≥ 10 % at every level measured.")
            continue
        if b["busiest_cores"] >= NEAR_FULL:
            why = "near one core: the ceiling of one Python process (GIL)"
        elif b["total_cores"] >= NEAR_FULL * cores:
            why = f"the machine's {cores} cores are nearly all busy"
        else:
            why = (
                "no process near a core and the machine not full: the calls wait (the broker "
                f"queue behind the worker's {conc} threads, the client's threads) or load "
                "outside the bench takes the cores (see the load average below)"
            )
        out.append(
            f"- {label}: the curve bends from {b['from']} to {b['to']} in flight "
            f"({b['gain']:+.0%} tasks/s); busiest process there: the {b['busiest']} at "
            f"{b['busiest_cores']:.2f} cores, all three {b['total_cores']:.2f} of {cores}; {why}."
        )
    out.append(
        f"- The workers run {conc} threads each: beyond {conc} groups in flight (one member "
        "each) tasks wait in the broker queue, so latency grows with the level while tasks/s "
        "cannot; every client thread shares the caller's one process (GIL)."
    )
    return out


def planning_section(plan: Json | None) -> list[str]:
    if plan is None:
        return [NA]
    cases = plan["cases"]
    header = ["µs, median / p99", *(f"{c['candidates']} candidates" for c in cases)]
    rows = []
    for key, label in PLAN_PARTS:
        if not any(key in c["times"] for c in cases):
            continue  # a part this run did not time

        def cell(t: Json | None) -> str:
            return "—" if t is None else f"{num(t['median_us'], 0)} / {num(t['p99_us'], 0)}"

        rows.append([label, *(cell(c["times"].get(key)) for c in cases)])
    rows.append(
        [
            "failure domains worked out, once per snapshot",
            *(num(c["dependence_once_us"], 0) for c in cases),
        ]
    )
    if any("evidence_decode_once_us" in c for c in cases):
        rows.append(
            [
                "the snapshot's co-failure evidence decoded, once per snapshot (pairs)",
                *(
                    f"{num(c.get('evidence_decode_once_us'), 0)} "
                    f"({num(c.get('evidence_pairs'), 0)})"
                    for c in cases
                ),
            ]
        )
    if all("after_snapshot" in c for c in cases):  # bench.rtsnapshot
        for way, label in (
            ("worked_out", "its pool's domains worked out from the evidence (as before)"),
            ("published", "its pool's domains as the snapshot publishes them"),
        ):
            rows.append(
                [
                    f"`Coordinator._plan` right after a new snapshot, {label}",
                    *(num(c["after_snapshot"][f"{way}_us"], 0) for c in cases),
                ]
            )
    rows.append(
        [
            "hedge size (with domains)",
            *(f"{c['hedge_size']} ({c['hedge_size_with_domains']})" for c in cases),
        ]
    )
    out = table(header, rows)
    b = plan.get("bend") or {}
    if b:
        out += ["", plan_bend_line(plan, b)]
    return out


def plan_bend_line(plan: Json, b: Json) -> str:
    """How each part grows from the smallest pool to the largest, and its share there."""
    cases = plan["cases"]
    g, share = b["time_growth"], b["share_of_plan_at_largest"]

    def grows(key: str) -> str:
        return "—" if key not in g else f"×{g[key]:.1f}"

    def part(key: str) -> str:
        return "—" if key not in share else f"{share[key]:.0%}"

    lo, hi = cases[0]["candidates"], cases[-1]["candidates"]
    return (
        f"From {lo} to {hi} candidates (×{b['size_growth']:.0f}): the plan's profile read "
        f"grows {grows('profiles')} (uncached {grows('profiles_uncached')}), the view build "
        f"{grows('build_view')}, the rule {grows('decide')} ({grows('decide_with_domains')} "
        f"with failure domains), the whole plan {grows('plan_read')} ({grows('plan')} on a "
        f"fresh view, no read). At {hi} candidates the profile read is "
        f"{part('profiles')} of the plan that reads (uncached, the read alone is "
        f"{part('profiles_uncached')} of it), the view build {part('build_view')}, the rule "
        f"{part('decide')}. Up to {plan['iters']} timed calls per part and size."
    )


def ingest_section(one: Json | None, two: Json | None) -> list[str]:
    runs = [(h, r) for h, r in (("1 harvester", one), ("2 harvesters", two)) if r is not None]
    if not runs:
        return [NA]

    def row(label: str, get: Any) -> list[str]:
        return [label, *(get(r) for _, r in runs)]

    rows = [
        row("raw COPY into `members`, rows/s", lambda r: num(r["raw_copy"]["rows_per_s"], 0)),
        row("XADD to the stream, entries/s", lambda r: num(r["stream_push"]["entries_per_s"], 0)),
        row(
            "stream → harvester → Postgres, traces/s",
            lambda r: f"**{num(r['harvest']['traces_per_s'], 0)}**",
        ),
        row("harvest / raw COPY", lambda r: f"{r['harvest_vs_raw_copy']:.0%}"),
        row(
            "harvest lag: max stream length, oldest entry s",
            lambda r: (
                f"{r['harvest']['max_stream_len']}, {num(r['harvest']['max_oldest_entry_age_s'])}"
            ),
        ),
        row("rows stored / traces", lambda r: f"{r['harvest']['rows_stored']} / {r['n']}"),
        row(f"busy cores while draining: {' · '.join(BUSY)}", _busy_cell),
    ]
    bend = ingest_bend_line(one, two)
    return [*table(["path", *(h for h, _ in runs)], rows), *([] if bend is None else ["", bend])]


BUSY = ("harvesters", "Postgres", "Redis", "machine")  # bench.ingest's busy_cores, in order


def _busy_cell(r: Json) -> str:
    b = r.get("busy_cores")  # absent from runs before bench.ingest counted it
    return "—" if b is None else " · ".join(num(b[k.lower()]) for k in BUSY)


def ingest_bend_line(one: Json | None, two: Json | None) -> str | None:
    """Where ingest bends from 1 to 2 harvesters and why, from what each drain kept busy
    (as ``bend_lines`` does for the growth curves); None without both runs' busy cores."""
    if one is None or two is None or "busy_cores" not in one or "busy_cores" not in two:
        return None
    b1, b2, cores = one["busy_cores"], two["busy_cores"], two.get("cpus") or 1

    def went(key: str) -> str:
        return "not on this machine" if b2[key] is None else f"{num(b1[key])} → {num(b2[key])}"

    per_harvester = max(b1["harvesters"] / one["harvesters"], b2["harvesters"] / two["harvesters"])
    if b2["machine"] >= NEAR_FULL * cores:
        why = (
            f"with two, the machine's {cores} cores are nearly all busy: the second "
            "harvester's CPU comes out of the cores Postgres and the first one use"
        )
    elif per_harvester >= NEAR_FULL:
        why = "a harvester near one core: the ceiling of one Python process (GIL)"
    else:
        why = (
            "no harvester near a core and the machine not full: the harvesters wait, on "
            "Postgres (each batch's upserts and commit) or on Redis"
        )
    gain = two["harvest"]["traces_per_s"] / one["harvest"]["traces_per_s"]
    raw = two["raw_copy"]["rows_per_s"] / one["raw_copy"]["rows_per_s"]
    return (
        f"From 1 to 2 harvesters the traces/s go ×{gain:.2f} "
        f"({one['harvest_vs_raw_copy']:.0%} → {two['harvest_vs_raw_copy']:.0%} of each run's "
        f"raw COPY, which itself went ×{raw:.2f} between the two runs). Busy cores while "
        f"draining, of {cores}: the harvesters {went('harvesters')}, Postgres "
        f"{went('postgres')}, Redis {went('redis')}, the whole machine {went('machine')}; "
        f"{why}."
    )


def ingest_command(r: Json) -> str:
    return (
        f"python -m bench.ingest --n {r['n']} --batch {r['batch']} --harvesters {r['harvesters']}"
    )


def lean_section(lean: Json | None) -> list[str]:
    """bench.leancall: CPU per call through redis-py's Redis and through LeanRedis."""
    if lean is None:
        return [NA]
    c, ratio = lean["cpu_us_per_call"], lean["lean_over_redis_py"]
    rows = [
        [
            what,
            num(c[f"{what} redis-py"], 1),
            num(c[f"{what} lean"], 1),
            f"{ratio[what]:.2f}",
        ]
        for what in ("ping", "script")
    ]
    head = ["call (script: 8 keys, 23 arguments)", "redis-py, µs", "lean, µs", "lean / redis-py"]
    return table(head, rows)


def report_script_section(rep: Json | None) -> list[str]:
    """bench.reportscript: the server's µs per member report script, by part."""
    if rep is None:
        return [NA]
    us = rep["server_us_per_report"]
    rows = [[case, num(v, 1)] for case, v in us.items()]
    return table(["report (windows full)", "Redis server µs per report"], rows)


def machine_section(inputs: Mapping[str, tuple[str, Json | None, str | None]]) -> list[str]:
    """Per JSON: the command that produced it (``inputs``' own, else the JSON's), when,
    on what. bench.ingest's JSON has no machine block: its cpus only."""
    rows = []
    for label, (path, data, given) in inputs.items():
        if data is None:
            rows.append([label, f"`{path}` missing", *("—",) * 6])
            continue
        command = given
        if command is None:
            command = ingest_command(data) if "harvest" in data else str(data.get("command", "?"))
        m = data.get("machine") or {"cpus": data.get("cpus")}
        redis = data.get("redis") or {}
        load = " ".join(f"{x:.2f}" for x in m.get("loadavg", []))
        after = " ".join(f"{x:.2f}" for x in m.get("loadavg_after", []))
        speed = [m.get(k) for k in ("python_loop_ms", "python_loop_ms_after")]
        rows.append(
            [
                label,
                f"`{command} > {path}`" if "harvest" in data else f"`{command}`",
                str(m.get("time") or "—"),
                str(m.get("cpus") or "—"),
                str(m.get("python") or "—"),
                f"{redis['version']} ({redis.get('source', '?')})" if "version" in redis else "—",
                f"{load} → {after}" if load else "—",
                " → ".join(f"{x:.0f}" for x in speed if x is not None) or "—",
            ]
        )
    header = [
        "JSON",
        "command",
        "date",
        "cpus",
        "python",
        "Redis",
        "load avg 1/5/15 before → after",
        "Python loop ms before → after",
    ]
    return table(header, rows)


def paired_rows(g: Json) -> list[list[str]]:
    """Beside the tail goal: the run against the ideal launch on its own draws."""
    pi = g.get("paired")
    if not pi:
        return []
    lo, hi = pi["p99_over_ci90"]
    return [
        [
            "… against the ideal launch on the same calls' own draws (paired), p99 ms",
            f"**{num(g['p99_ms'], 1)}** at {g['extra_load']:.1%}",
            f"the same draws launched ideally at {g['extra_load']:.1%}: {num(pi['p99_ms'], 1)} "
            f"(delay {num(pi['delay_ms'], 1)} ms; {pi['filled']} backups drawn afresh)",
            "—",
            "beside the goal: the draws' sampling cancels (`bench/tailideal.py`)",
            f"{times(pi['p99_over'])}; 90% interval {times(lo)}–{times(hi)}; policy "
            f"{times(pi['same_draws_over'])}{_policy_split(pi, g.get('refused'))}",
        ]
    ]


def _policy_split(pi: Json, refused: Json | None) -> str:
    """The policy's share on the backend's draws, then with the budget's refusals paid
    (runs from 2026-12-06 on; older reports have neither)."""
    if pi.get("draws_over") is None or pi.get("draws_paid_over") is None:
        return ""
    n = "" if not refused else f" {refused['budget']}"
    return (
        f" ({times(pi['draws_over'])} on the backend's draws, {times(pi['draws_paid_over'])} "
        f"with the budget's{n} refusals paid)"
    )
