"""bench.runtally: the runs table's goals judged as the report judges them, and the
tallies the prose of docs/BENCHMARKS.md states checked against the table they come from."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench import runtally

HEAD = (
    "### Issue 12 at a glance (hand-written)\n\n"
    "| run | code | 1 member | 2 / 1 | tasks/s | ingest (raw COPY) | tail |\n"
    "| --- | --- | --- | --- | --- | --- | --- |\n"
)


def row(time: str, one: str, two: str, tasks: str, ingest: str, tail: str) -> str:
    return f"| {time} | `{time[:2] * 4}` | {one} | {two} | {tasks} | {ingest} | {tail} |"


AT_THRESHOLDS = row(
    "10:00", "0.75× · 1.00×", "1.20× · 1.20×", "90% · 90%", "50 000 (80 000)", "1.05× at 5.0%"
)
JUST_OVER = row(
    "11:00",
    "0.751× · 0.50×",
    "1.21× · 1.00×",
    "89.7% · 100%",
    "49 999 (60 000)",
    "1.04× at 5.02% (paired 1.06×)",
)
NO_LOAD_MISS = row(
    "12:00", "0.90× · 0.90×", "1.30× · 1.30×", "100% · 100%", "30 000 (40 000)", "1.10×"
)
NO_LOAD_MET = row(
    "13:00", "0.70× · 1.01×", "1.10× · 1.25×", "95% · 120%", "70 000 (90 000)", "1.03×"
)
ROWS = [AT_THRESHOLDS, JUST_OVER, NO_LOAD_MISS, NO_LOAD_MET]


def doc(rows: list[str]) -> str:
    return "# Benchmarks\n\n" + HEAD + "\n".join(rows) + "\n\nHow often each goal was met\n"


def test_a_figure_at_its_threshold_meets_the_goal_and_one_past_it_does_not() -> None:
    res = runtally.tally(runtally.read_runs(doc(ROWS)))
    goals = {g: v["runs"] for g, v in res["goals"].items()}
    assert goals == {
        "one_member": ["10:00"],  # 13:00's p99 is over bare's
        "two_members": ["10:00"],  # 13:00's p99 is over 1.2×
        "tasks": ["10:00", "12:00", "13:00"],
        "ingest": ["10:00", "13:00"],
        "tail": ["10:00", "13:00"],  # 11:00 is within 1.05× but at 5.02% extra load
    }
    assert res["goals"]["tasks"]["met"] == 3
    assert res["both_overhead_goals"] == ["10:00"]
    assert res["runs"] == 4


def test_a_row_keeps_every_cell() -> None:
    run = runtally.parse_row(JUST_OVER)
    assert (run.time, run.code, run.one_p50, run.one_p99) == ("11:00", "11111111", 0.751, 0.5)
    assert (run.tasks_one, run.ingest, run.raw_copy) == (pytest.approx(0.897), 49_999, 60_000)
    assert (run.tail, run.tail_load_pct, run.tail_paired) == (1.04, 5.02, 1.06)
    assert runtally.parse_row(NO_LOAD_MISS).tail_load_pct is None


def test_ingest_misses_ranked_by_the_runs_raw_copy() -> None:
    res = runtally.tally(runtally.read_runs(doc(ROWS)))
    # raw COPY 40k, 60k, 80k, 90k: the misses are the slowest and the second slowest
    assert res["ingest_misses_raw_copy_rank"] == [2, 1]


def test_the_overhead_ratios_correlation_by_value_and_by_rank() -> None:
    rows = []
    for i, (one, two) in enumerate([(0.70, 1.60), (0.80, 1.50), (0.90, 1.20), (1.00, 1.19)]):
        rows.append(
            f"| 0{i}:00 | `abcdef{i}` | {one:.2f}× · 0.9× | {two:.2f}× · 1.3× | 100% · 100% "
            "| 60 000 (90 000) | 1.02× |"
        )
    res = runtally.tally(runtally.read_runs(doc(rows)))
    corr = res["correlation_one_two_p50"]
    assert corr["rank"] == pytest.approx(-1.0)  # strictly falling: ranks reversed
    assert -1.0 < corr["pearson"] < -0.9  # falling, but not on a line
    assert res["two_p50_by_spell"]["one_p50_at_least_0.95"]["runs"] == 1
    assert res["two_p50_by_spell"]["other"]["max"] == 1.60


def test_tied_values_share_their_average_rank() -> None:
    assert runtally.ranks([3.0, 1.0, 2.0, 2.0]).tolist() == [4.0, 1.0, 2.5, 2.5]


@pytest.mark.parametrize(
    ("row", "named"),
    [
        (AT_THRESHOLDS.replace("0.75× · 1.00×", "0.75x · 1.00×"), "'0.75x · 1.00×'"),
        (AT_THRESHOLDS.replace("50 000 (80 000)", "50 000"), "ingest cell '50 000'"),
        (AT_THRESHOLDS.replace("1.05× at 5.0%", "1.05 at 5%"), "tail cell '1.05 at 5%'"),
        (AT_THRESHOLDS.replace(" | 1.05× at 5.0% |", " |"), "6 cells, expected 7"),
        (AT_THRESHOLDS.replace("0.75× · 1.00×", "0.7.5× · 1.00×"), "'0.7.5× · 1.00×'"),
        (AT_THRESHOLDS.replace("50 000 (80", "50 0000 (80"), "'50 0000 (80 000)'"),
    ],
)
def test_a_bad_cell_is_named_with_its_run(row: str, named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)) as err:
        runtally.read_runs(doc([AT_THRESHOLDS, row]))
    assert "10:00" in str(err.value)


def test_a_document_without_the_section_is_refused() -> None:
    with pytest.raises(ValueError, match="no section"):
        runtally.read_runs("# Benchmarks\n")
    with pytest.raises(ValueError, match="no runs table"):
        runtally.read_runs(HEAD)
    with pytest.raises(ValueError, match="no runs to tally"):
        runtally.tally([])


def test_the_command_prints_json_and_names_a_bad_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good, out = tmp_path / "good.md", tmp_path / "out" / "tally.json"
    good.write_text(doc(ROWS))
    runtally.main(["--doc", str(good), "--json", str(out)])
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    assert printed["goals"]["ingest"]["met"] == 2
    bad = tmp_path / "bad.md"
    bad.write_text(doc([NO_LOAD_MET.replace("70 000", "seventy")]))
    with pytest.raises(SystemExit) as exit_:
        runtally.main(["--doc", str(bad)])
    assert exit_.value.code == 2
    assert str(bad) in capsys.readouterr().err


# The prose under the runs table states its tallies by hand: each must be what the table
# gives, so a row added without its tallies (or the reverse) fails here.
TALLIES = {
    "tasks": r"\*tasks/s ≥ 90% of bare\*: (\d+) of (\d+)",
    "ingest": r"\*ingest ≥ 50k traces/s with one harvester\*: (\d+) of (\d+)",
    "one_member": r"\*1 member, p50 ≤ 0\.75× bare and p99 ≤ bare\*: (\d+) of (\d+)",
    "tail": r"\*staggered tail ≤ 1\.05× at ≤ 5% extra load\*: (\d+) of (\d+)",
    "two_members": r"\*2 members ≤ 1\.2× 1 member\*: (\d+) of (\d+)",
}


def test_the_benchmarks_prose_states_what_its_runs_table_gives() -> None:
    text = runtally.DOC.read_text()
    res = runtally.tally(runtally.read_runs(text))
    n = res["runs"]
    assert f"How often each goal was met in these {n} runs" in text
    for goal, pattern in TALLIES.items():
        m = re.search(pattern, text)
        assert m is not None, pattern
        assert (int(m[1]), int(m[2])) == (res["goals"][goal]["met"], n), goal
    corr = res["correlation_one_two_p50"]
    stated = re.findall(r"Over the (\d+) runs.{0,80}?correlate at −(\d\.\d\d)", text, re.S)
    assert stated, "the correlation's statement"
    for runs, value in stated:
        assert (int(runs), float(value)) == (n, round(-corr["pearson"], 2))
    assert f"(Pearson; −{-corr['rank']:.2f} by rank)" in text
    median = re.search(r"The median over the (\d+) runs\s+is (\d\.\d+)×", text)
    assert median is not None, "the 1-member median's statement"
    assert (int(median[1]), float(median[2])) == (n, round(res["one_p50"]["median"], 2))
