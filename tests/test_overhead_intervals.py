"""The dispatch overhead's ratios with their intervals over a run's interleaved blocks
(bench/hotpath_goals.py ``blocks_ratio_ci90``, bench/rtoverhead.py's blocks), and the
report's verdict cells that show them; bare Celery's own second task beside them; and
how a settled 2-member call waits for its loser's report (on this run's Redis)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import redis
from test_hotpath_report import DOC, RUNTIME, _block, _pct, _row, _write

from bench.hotpath_goals import blocks_ratio_ci90, overhead_goals
from bench.hotpath_report import main
from bench.rtlib import Marks
from bench.rtoverhead import (
    SettlingStore,
    _blocks,
    _overhead_s,
    bare_overhead_s,
    settle_group,
    still_to_report,
)
from coordinator.runtime.coordinator import WAKE
from coordinator.runtime.liveness import started_token
from coordinator.state import keys
from coordinator.state.closing import closed_token

# Ten blocks whose level moves by a factor of three between spells of the machine.
SPELLS = [1.0, 3.0, 1.2, 2.5, 1.0, 1.8, 2.9, 1.1, 1.5, 2.0]


def _spread(level: float, n: int = 50) -> list[float]:
    return [level * (1.0 + 0.01 * i) for i in range(n)]


def test_a_ratio_the_same_in_every_block_has_no_width_however_the_spells_move() -> None:
    den = [_spread(s) for s in SPELLS]
    num = [[0.8 * x for x in b] for b in den]
    for q in (50, 99):
        ci = blocks_ratio_ci90(num, den, q)
        assert ci == pytest.approx([0.8, 0.8])
    # Unpaired, the same spells would make a wide interval: the pairing is what removes
    # them (block i of each was measured in the same spell).
    shuffled = [den[(i + 1) % len(den)] for i in range(len(den))]
    wide = blocks_ratio_ci90(num, shuffled, 50)
    assert wide is not None and wide[1] - wide[0] > 0.1


def test_the_interval_spans_the_blocks_ratios_and_holds_the_runs_own() -> None:
    den = [_spread(1.0) for _ in SPELLS]
    num = [_spread(0.7 if i % 2 else 0.9) for i in range(len(SPELLS))]
    lo, hi = blocks_ratio_ci90(num, den, 50) or (None, None)
    assert lo is not None and hi is not None
    assert 0.7 <= lo < 0.8 < hi <= 0.9
    assert blocks_ratio_ci90(num, den, 50, seed=1) != blocks_ratio_ci90(num, den, 50, seed=2)
    assert blocks_ratio_ci90(num, den, 50, seed=3) == blocks_ratio_ci90(num, den, 50, seed=3)


@pytest.mark.parametrize(
    ("num", "den"),
    [([[1.0]], [[2.0]]), ([[1.0], []], [[2.0], [2.0]]), ([], [])],
    ids=["one block", "an empty block", "none"],
)
def test_too_few_blocks_or_an_empty_one_give_no_interval(
    num: list[list[float]], den: list[list[float]]
) -> None:
    assert blocks_ratio_ci90(num, den, 50) is None


def test_the_bench_cuts_its_calls_into_blocks_leaving_out_calls_without_a_trace() -> None:
    ok = {"status": "succeeded", "started_at_s": 10.0, "finished_at_s": 10.25}
    slow = {"status": "succeeded", "started_at_s": 10.0, "finished_at_s": 10.5}
    failed = {"status": "failed", "started_at_s": 10.0, "finished_at_s": 10.01}
    traces = {"g1": [slow, ok, failed], "g2": [failed]}
    # The group's latency less its fastest succeeded member's own: 1.0 − 0.25 s.
    assert _overhead_s(("g1", 100.0, 101.0, 1.0, ""), traces) == pytest.approx(0.75)
    assert _overhead_s(("g2", 100.0, 101.0, 1.0, ""), traces) is None
    assert _overhead_s(("g3", 100.0, 101.0, 1.0, ""), traces) is None
    blocks = _blocks([2, 3, 1], [0.001, None, 0.002, 0.003, 0.004, None])  # s in, ms out
    assert blocks == [[pytest.approx(1.0)], pytest.approx([2.0, 3.0, 4.0]), []]


def test_the_goals_and_the_report_give_each_ratio_its_interval(tmp_path: Path) -> None:
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text(DOC, encoding="utf-8")
    assert "one_over_bare_p50_ci90" not in overhead_goals(RUNTIME["results"]["overhead"])
    main(_write(tmp_path, RUNTIME))  # no blocks in the run: no interval shown
    assert "90% interval" not in _row(_block(doc.read_text(encoding="utf-8")), "dispatch")
    res = copy.deepcopy(RUNTIME)
    ov = res["results"]["overhead"]
    bare = [_spread(2.0 * s) for s in SPELLS]
    ov["rounds"] = len(SPELLS)
    ov["blocks_ms"] = {
        "bare_celery_roundtrip": bare,
        "haco_1": [[0.5 * x for x in b] for b in bare],
        "haco_2": [[0.55 * x for x in b] for b in bare],
    }
    g = overhead_goals(ov)
    assert g["haco_1"] is True  # the verdict is the run's own ratio, as before
    assert g["one_over_bare_p50_ci90"] == pytest.approx([0.5, 0.5])
    assert g["two_over_one_p99_ci90"] == pytest.approx([1.1, 1.1])
    main(_write(tmp_path, res))
    block = _block(doc.read_text(encoding="utf-8"))
    one = _row(block, "dispatch overhead, 1 member")
    assert "90% interval 0.50×–0.50× · 0.50×–0.50× over the 10 blocks" in one
    two = _row(block, "dispatch overhead, 2 members")
    assert "90% interval 1.10×–1.10× · 1.10×–1.10× over the 10 blocks" in two


def test_a_bare_call_is_measured_as_a_group_first_reply_less_its_fastest_tasks_own() -> None:
    one = [json.dumps(["0.0", 10.0, 10.3])]
    assert bare_overhead_s(100.0, 101.0, one) == pytest.approx(0.7)  # round trip − own
    # Two tasks: the first reply's time, less the smaller own time of the two (the later
    # reply's here), as a group's latency less its fastest member's own.
    two = [json.dumps(["0.0", 10.0, 10.5]).encode(), json.dumps(["0.1", 10.2, 10.4])]
    assert bare_overhead_s(100.0, 101.0, two) == pytest.approx(0.8)


def test_bare_celerys_second_task_and_haco_against_it_are_ratios_with_intervals_beside_the_goal(
    tmp_path: Path,
) -> None:
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text(DOC, encoding="utf-8")
    plain = overhead_goals(RUNTIME["results"]["overhead"])
    assert "bare_two_over_one_p50" not in plain  # not measured: no ratio, no interval
    assert "two_over_bare_two_p50" not in plain
    main(_write(tmp_path, RUNTIME))
    assert "2 tasks" not in _row(_block(doc.read_text(encoding="utf-8")), "dispatch overhead, 2")
    res = copy.deepcopy(RUNTIME)
    ov = res["results"]["overhead"]
    ov.update(bare_celery_1_task=_pct(1.0, 2.0), bare_celery_2_tasks=_pct(1.15, 2.6))
    one = [_spread(s) for s in SPELLS]
    ov["rounds"] = len(SPELLS)
    ov["blocks_ms"] = {
        "bare_celery_1_task": one,
        "bare_celery_2_tasks": [[1.15 * x for x in b] for b in one],
        "haco_2": [[1.035 * x for x in b] for b in one],  # 0.9× bare's two tasks in each block
    }
    g = overhead_goals(ov)
    assert g["haco_2"] is plain["haco_2"]  # beside the goal: its verdict unchanged
    assert (g["bare_two_over_one_p50"], g["bare_two_over_one_p99"]) == pytest.approx((1.15, 1.3))
    assert g["bare_two_over_one_p50_ci90"] == pytest.approx([1.15, 1.15])
    assert "one_over_bare_p50_ci90" not in g  # HACO's blocks not in this run: none
    main(_write(tmp_path, res))
    row = _row(_block(doc.read_text(encoding="utf-8")), "dispatch overhead, 2 members")
    assert "2 tasks 1.15 / 2.60, 1 task 1.00 / 2.00" in row
    assert "1.15× · 1.30×; 90% interval 1.15×–1.15×" in row
    # HACO's two members against Celery's two tasks: 1.1 / 1.15 and 3.3 / 2.6 ms.
    assert (g["two_over_bare_two_p50"], g["two_over_bare_two_p99"]) == pytest.approx(
        (1.1 / 1.15, 3.3 / 2.6)
    )
    assert g["two_over_bare_two_p50_ci90"] == pytest.approx([0.9, 0.9])
    assert "2 tasks: 0.96× · 1.27×; 90% interval 0.90×–0.90×" in row


def test_a_settled_call_waits_for_its_other_members_reports_past_the_tokens(
    redis_db: redis.Redis,
) -> None:
    key = keys.group_replies("g1")
    # As the list fills: the loser's start token, the winner's close token, a timer's
    # wake token, the loser's report; LPUSH in that order, BRPOP takes the oldest first.
    redis_db.lpush(key, started_token(1), closed_token(0), WAKE, json.dumps({"trace": {}}))
    assert settle_group(redis_db, "g1", 1, timeout_s=1.0)
    assert redis_db.llen(key) == 0
    # Nothing to wait for: nothing popped.
    redis_db.lpush(key, started_token(2))
    assert settle_group(redis_db, "g1", 0, timeout_s=1.0)
    assert redis_db.llen(key) == 1


def test_a_call_whose_loser_never_reports_is_counted_not_settled(redis_db: redis.Redis) -> None:
    key = keys.group_replies("g2")
    redis_db.lpush(key, json.dumps({"trace": {}}), started_token(2))
    # Two others to wait for and one report: the bound ends the wait.
    assert not settle_group(redis_db, "g2", 2, timeout_s=0.05)
    assert not settle_group(redis_db, "g3", 1, timeout_s=0.0)  # no time left: no wait


def test_the_reports_a_coordinator_pops_with_the_winners_are_not_waited_for(
    redis_db: redis.Redis,
) -> None:
    store = SettlingStore(redis_db, Marks())
    # Not counting (the calls measured for the goals): nothing parsed, nothing counted.
    redis_db.lpush(keys.group_replies("g3"), json.dumps({"trace": {}}))
    assert len(store.pop_replies("g3", 0.1, 16)) == 1
    assert store.taken["g3"] == 0
    store.counting = True
    key = keys.group_replies("g4")
    # Both members reported before the coordinator's pop: one batch takes both reports,
    # past the start, close and wake tokens.
    redis_db.lpush(key, started_token(1), closed_token(0), json.dumps({"trace": {}}))
    redis_db.lpush(key, WAKE, json.dumps({"trace": {}}))
    assert len(store.pop_replies("g4", 0.1, 16)) == 5
    assert store.taken["g4"] == 2
    assert still_to_report(2, store.taken["g4"]) == 0
    assert settle_group(redis_db, "g4", 0, timeout_s=0.0)
    # One report taken by a single pop, none by a pop that found only a token.
    redis_db.lpush(keys.group_replies("g5"), started_token(0))
    assert store.pop_reply("g5", 0.1) is not None
    redis_db.lpush(keys.group_replies("g5"), json.dumps({"trace": {}}))
    assert store.pop_reply("g5", 0.1) is not None
    assert store.taken["g5"] == 1
    assert still_to_report(2, store.taken["g5"]) == 1


def test_a_call_still_waits_for_the_members_its_coordinator_did_not_hear() -> None:
    assert still_to_report(3, 1) == 2
    assert still_to_report(2, 0) == 1  # the winner's report, however the call heard it
    assert still_to_report(1, 1) == 0
