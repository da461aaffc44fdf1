"""Winner rules (spec §4): ranked (the paper's), first and best, with a deadline."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core.winner import PENDING, Report, Resolution, resolve, verdict
from coordinator.errors import PolicyError
from schemas.enums import WinnerMode


def ok(at: float, quality: float | None = None) -> Report:
    return Report(at_s=at, success=True, quality=quality)


def fail(at: float) -> Report:
    return Report(at_s=at, success=False)


# ---------------------------------------------------------------- ranked


def test_ranked_lower_success_waits_for_higher_failure() -> None:
    res = resolve(WinnerMode.RANKED, [fail(5.0), ok(1.0)])
    assert res == Resolution(winner=1, at_s=5.0, timed_out=())


def test_ranked_best_ranked_success_wins_even_when_slower() -> None:
    res = resolve(WinnerMode.RANKED, [ok(4.0), ok(1.0)])
    assert res.winner == 0
    assert res.at_s == 4.0


def test_ranked_time_is_max_over_ranks_up_to_the_winner() -> None:
    res = resolve(WinnerMode.RANKED, [fail(2.0), fail(7.0), ok(3.0), ok(1.0), fail(9.0)])
    assert res.winner == 2
    assert res.at_s == 7.0
    res = resolve(WinnerMode.RANKED, [fail(2.0), fail(1.0), ok(3.0), ok(0.5)])
    assert res.winner == 2
    assert res.at_s == 3.0


def test_ranked_verdict_is_pending_while_a_higher_rank_is_silent() -> None:
    assert verdict(WinnerMode.RANKED, [None, ok(1.0)]) == PENDING
    assert verdict(WinnerMode.RANKED, [fail(2.0), ok(1.0), None]).winner == 1
    assert verdict(WinnerMode.RANKED, [ok(2.0), None]).winner == 0


# ---------------------------------------------------------------- first / best


def test_first_earliest_success_wins() -> None:
    res = resolve(WinnerMode.FIRST, [ok(5.0), fail(1.0), ok(2.0), ok(3.0)])
    assert res.winner == 2
    assert res.at_s == 2.0


def test_first_tie_in_time_goes_to_the_better_rank() -> None:
    res = resolve(WinnerMode.FIRST, [fail(0.5), ok(2.0), ok(2.0)])
    assert res.winner == 1
    assert res.at_s == 2.0


def test_first_verdict_does_not_wait_for_silent_members() -> None:
    assert verdict(WinnerMode.FIRST, [None, ok(3.0), None]).winner == 1
    assert verdict(WinnerMode.FIRST, [None, fail(3.0)]) == PENDING


def test_best_waits_for_all_and_picks_highest_quality() -> None:
    res = resolve(WinnerMode.BEST, [ok(1.0, 0.5), ok(3.0, 0.9), fail(10.0), ok(2.0, 0.7)])
    assert res.winner == 1
    assert res.at_s == 10.0
    assert verdict(WinnerMode.BEST, [ok(1.0, 0.9), None]) == PENDING


def test_best_quality_tie_goes_to_the_better_rank() -> None:
    res = resolve(WinnerMode.BEST, [fail(1.0), ok(3.0, 0.8), ok(2.0, 0.8)])
    assert res.winner == 1
    assert res.at_s == 3.0


def test_best_ignores_quality_of_failures() -> None:
    failed_but_scored = Report(at_s=1.0, success=False, quality=1.0)
    res = resolve(WinnerMode.BEST, [failed_but_scored, ok(2.0, 0.1)])
    assert res.winner == 1


# ---------------------------------------------------------------- all failed / deadline


@pytest.mark.parametrize("mode", list(WinnerMode))
def test_all_failed_resolves_at_last_report(mode: WinnerMode) -> None:
    res = resolve(mode, [fail(3.0), fail(8.0), fail(1.0)])
    assert res.winner is None
    assert res.at_s == 8.0
    assert res.timed_out == ()
    assert verdict(mode, [fail(3.0), fail(8.0), fail(1.0)]).all_failed


@pytest.mark.parametrize("mode", list(WinnerMode))
def test_late_reports_become_timeouts_at_the_deadline(mode: WinnerMode) -> None:
    res = resolve(mode, [ok(12.0, 1.0), ok(3.0, 0.5), fail(4.0), ok(15.0, 0.9)], deadline_s=10.0)
    assert res.winner == 1
    assert res.timed_out == (0, 3)
    expected_at = 3.0 if mode is WinnerMode.FIRST else 10.0
    assert res.at_s == expected_at


@pytest.mark.parametrize("mode", list(WinnerMode))
def test_everyone_late_is_all_failed_at_the_deadline(mode: WinnerMode) -> None:
    res = resolve(mode, [ok(12.0, 1.0), fail(11.0)], deadline_s=10.0)
    assert res == Resolution(winner=None, at_s=10.0, timed_out=(0, 1))


def test_report_exactly_at_deadline_is_in_time() -> None:
    res = resolve(WinnerMode.RANKED, [ok(10.0)], deadline_s=10.0)
    assert res == Resolution(winner=0, at_s=10.0, timed_out=())


def test_empty_group_is_rejected() -> None:
    with pytest.raises(PolicyError, match="at least one member"):
        resolve(WinnerMode.RANKED, [])


# ---------------------------------------------------------------- properties

reports_st = st.lists(
    st.builds(
        Report,
        at_s=st.floats(0.0, 100.0),
        success=st.booleans(),
        quality=st.one_of(st.none(), st.floats(0.0, 1.0)),
    ),
    min_size=1,
    max_size=8,
)
deadline_st = st.one_of(st.just(math.inf), st.floats(0.0, 100.0))


def effective(reports: list[Report], deadline: float) -> list[Report]:
    return [r if r.at_s <= deadline else Report(deadline, False) for r in reports]


@settings(max_examples=200, deadline=None, database=None)
@given(reports_st, deadline_st)
def test_ranked_winner_is_the_best_ranked_success(reports: list[Report], deadline: float) -> None:
    res = resolve(WinnerMode.RANKED, reports, deadline_s=deadline)
    eff = effective(reports, deadline)
    successes = [i for i, r in enumerate(eff) if r.success]
    expected = successes[0] if successes else None
    assert res.winner == expected
    last = len(eff) - 1 if expected is None else expected
    assert res.at_s == max(r.at_s for r in eff[: last + 1])
    assert res.timed_out == tuple(i for i, r in enumerate(reports) if r.at_s > deadline)


@settings(max_examples=200, deadline=None, database=None)
@given(reports_st, deadline_st)
def test_first_winner_is_the_earliest_success(reports: list[Report], deadline: float) -> None:
    res = resolve(WinnerMode.FIRST, reports, deadline_s=deadline)
    eff = effective(reports, deadline)
    successes = sorted((r.at_s, i) for i, r in enumerate(eff) if r.success)
    if successes:
        assert (res.at_s, res.winner) == successes[0]
    else:
        assert res.winner is None
        assert res.at_s == max(r.at_s for r in eff)


@settings(max_examples=200, deadline=None, database=None)
@given(reports_st, deadline_st)
def test_best_winner_has_top_quality_and_waits_for_all(
    reports: list[Report], deadline: float
) -> None:
    res = resolve(WinnerMode.BEST, reports, deadline_s=deadline)
    eff = effective(reports, deadline)
    assert res.at_s == max(r.at_s for r in eff)
    scores = [(r.quality or 0.0) for r in eff]
    successes = [i for i, r in enumerate(eff) if r.success]
    if not successes:
        assert res.winner is None
        return
    top = max(scores[i] for i in successes)
    assert res.winner == min(i for i in successes if scores[i] == top)
