"""The cells beside the 2-member goal in docs/BENCHMARKS.md's issue-12 block
(bench/hotpath_report.py), none of them judged: bare Celery's own second task, and
HACO's two members in two zones, and settled (each call waiting for its loser's report
before the next, as bare Celery's 2-task calls wait for their second task); with each
ratio's interval over the run's blocks."""

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
