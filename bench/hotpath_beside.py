"""The cells beside the overhead goals in docs/BENCHMARKS.md's issue-12 block
(bench/hotpath_report.py), none of them judged: bare Celery's own second task, and
HACO's two members in two zones, and settled (each call waiting for its loser's report
before the next, as bare Celery's 2-task calls wait for their second task); with each
ratio's interval over the run's blocks. And bench.memberstamps' count of the calls less
the backend's call alone, the member's start claim and hand-off the runtime's."""

from __future__ import annotations

from bench.hotpath_goals import BESIDE_TWO
from bench.hotpath_tables import Json, num, span, times


def blocks_note(g: Json, ratio: str, ov: Json) -> str:
    """An overhead ratio's 90% intervals (p50 · p99) over the run's blocks, if measured."""
    p50, p99 = g.get(f"{ratio}_p50_ci90"), g.get(f"{ratio}_p99_ci90")
    if p50 is None and p99 is None:
        return ""
    return f"; 90% interval {span(p50)} · {span(p99)} over the {ov.get('rounds')} blocks"


def bare_two(ov: Json, g: Json) -> str:
    """Bare Celery's own second task beside the 2-member goal: a call of two tasks
    sleeping the members' draw against one, each measured as a group is; and HACO's two
    members against Celery's two tasks."""
    if "bare_celery_2_tasks" not in ov:
        return "—"
    b1, b2 = ov["bare_celery_1_task"], ov["bare_celery_2_tasks"]
    return (
        f"2 tasks {num(b2['p50_ms'])} / {num(b2['p99_ms'])}, 1 task {num(b1['p50_ms'])} / "
        f"{num(b1['p99_ms'])} (sleeping the members' draw; first reply less the fastest "
        f"task's own time): {times(g['bare_two_over_one_p50'])} · "
        f"{times(g['bare_two_over_one_p99'])}{blocks_note(g, 'bare_two_over_one', ov)}. "
        f"HACO's 2 members over bare Celery's 2 tasks: {times(g['two_over_bare_two_p50'])} · "
        f"{times(g['two_over_bare_two_p99'])}{blocks_note(g, 'two_over_bare_two', ov)}"
    )


# The rows beside the 2-member goal (their ratios: hotpath_goals.BESIDE_TWO): what they
# measured, and their note.
BESIDE_ROWS = {
    "haco_2_zones": (
        "… the 2 members in two zones (a worker process each), p50 / p99 ms",
        "beside the goal (the row above: both in one worker)",
    ),
    "haco_2_settled": (
        "… the 2 members, each call waiting for its loser's report, p50 / p99 ms",
        "beside the goal: the next call starts after the loser, as bare Celery's "
        "2-task calls start after their second task",
    ),
}


def beside_two_rows(ov: Json, g: Json) -> list[list[str]]:
    """The rows beside the 2-member goal that the overhead results ``ov`` hold (``g``:
    their goals)."""
    rows = []
    for key, (what, note) in BESIDE_ROWS.items():
        if key not in ov:
            continue
        ratio = BESIDE_TWO[key]
        st, missed = ov[key]["overhead"], ov[key].get("unsettled_calls")
        rows.append(
            [
                what,
                f"**{num(st['p50_ms'])} / {num(st['p99_ms'])}**",
                "—",
                "—",
                note + (f" ({missed} calls not settled in time)" if missed else ""),
                f"{times(g[ratio + '_p50'])} · {times(g[ratio + '_p99'])} of 1 member"
                f"{blocks_note(g, ratio, ov)}{_of_bare_two(g, ratio)}",
            ]
        )
    return rows


def _of_bare_two(g: Json, ratio: str) -> str:
    """A row's calls over bare Celery's 2-task calls, where the goals give that ratio."""
    over_bare = ratio.replace("_over_one", "_over_bare_two")
    p50, p99 = g.get(f"{over_bare}_p50"), g.get(f"{over_bare}_p99")
    if p50 is None or p99 is None:
        return ""
    return f"; {times(p50)} · {times(p99)} of bare Celery's 2 tasks"


PCT = ("p50", "p99")  # the ratios' percentiles, in the row's order


def less_backend_rows(stamps: Json | None) -> list[list[str]]:
    """bench.memberstamps' row, if it ran: its 1-member calls less the backend's call
    alone against bare Celery's round trip in its own blocks, beside the goals' count of
    the same calls, and its 2 members against 1 on both counts."""
    if stamps is None or "haco_1" not in stamps or "less_backend" not in stamps["haco_1"]:
        return []
    one, bare, q = stamps["haco_1"]["less_backend"], stamps["bare_roundtrip"], stamps["ratios"]

    def pair(name: str) -> str:
        """A ratio at p50 · p99, a dash for one the run could not give."""
        return " · ".join(times(q[f"{name}_{p}"]) if f"{name}_{p}" in q else "—" for p in PCT)

    return [
        [
            "… 1 member, its group's latency less the backend's call alone "
            "(`bench.memberstamps`, its own blocks), p50 / p99 ms",
            f"**{num(one['p50_ms'])} / {num(one['p99_ms'])}**",
            "—",
            f"round trip {num(bare['p50_ms'])} / {num(bare['p99_ms'])} in its blocks",
            "beside the goal: the member's start claim and its hand-off, which the goals' "
            "count books as the member's own time, counted as the runtime's",
            f"{pair('one_less_backend_over_bare')} of bare (the goals' count there: "
            f"{pair('one_less_own_over_bare')}); 2 / 1 member "
            f"{pair('two_over_one_less_backend')} (the goals' count there: "
            f"{pair('two_over_one_less_own')})",
        ]
    ]
