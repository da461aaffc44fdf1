"""The ``best`` rule with unjudged outputs (coordinator.core.judged): pure, injected
time. The runtime part (waiting for the judge, the fallback, the store's judged hash) is
in tests/test_judged_runtime.py."""

from __future__ import annotations

import math

import pytest

from coordinator.core.judged import (
    NO_EVALUATOR,
    NONE_JUDGED,
    PENDING,
    BestVerdict,
    decide_best,
)
from coordinator.core.winner import Report, verdict
from schemas.enums import WinnerMode

OK = Report(1.0, True)  # a success no backend judged
FAIL = Report(0.5, False)


def judged(q: float) -> Report:
    return Report(1.0, True, q)


def decide(
    reports: list[Report | None],
    scores: dict[int, float | None] | None = None,
    *,
    evaluator: bool = True,
    now: float = 0.0,
    until: float = 10.0,
) -> BestVerdict:
    return decide_best(reports, scores or {}, evaluator=evaluator, now_s=now, wait_until_s=until)


def test_backend_judged_outputs_decide_as_the_plain_rule() -> None:
    reports: list[Report | None] = [judged(0.4), FAIL, judged(0.9), judged(0.9)]
    got = decide(reports)
    plain = verdict(WinnerMode.BEST, reports)
    assert (got.decided, got.winner, got.rule, got.fallback_reason) == (
        True,
        plain.winner,
        WinnerMode.BEST,
        None,
    )
    assert got.winner == 2 and got.quality == 0.9  # ties go to the better rank


def test_pending_until_every_member_reported() -> None:
    assert decide([judged(0.5), None]) is PENDING
    assert decide([None, FAIL], evaluator=False) is PENDING


def test_all_failed_needs_no_judge() -> None:
    got = decide([FAIL, FAIL], evaluator=False)
    assert (got.decided, got.winner, got.rule, got.fallback_reason) == (
        True,
        None,
        WinnerMode.BEST,
        None,
    )


def test_no_evaluator_falls_back_to_ranked_at_once() -> None:
    got = decide([FAIL, OK, judged(0.99)], evaluator=False, now=0.0, until=math.inf)
    assert (got.winner, got.rule, got.fallback_reason) == (1, WinnerMode.RANKED, NO_EVALUATOR)
    assert got.quality is None


def test_waits_for_the_judge_until_the_wait_ends() -> None:
    reports: list[Report | None] = [OK, OK]
    assert decide(reports, {0: 0.2}, now=9.99, until=10.0) is PENDING
    got = decide(reports, {0: 0.2, 1: 0.7}, now=9.99, until=10.0)
    assert (got.winner, got.rule, got.fallback_reason, got.quality) == (
        1,
        WinnerMode.BEST,
        None,
        0.7,
    )


def test_judge_scores_and_backend_scores_mix() -> None:
    got = decide([judged(0.6), OK, FAIL], {1: 0.5})
    assert (got.winner, got.quality, got.fallback_reason) == (0, 0.6, None)


def test_expired_wait_picks_the_best_judged_and_says_so() -> None:
    got = decide([OK, OK, OK], {2: 0.3}, now=10.0, until=10.0)
    assert (got.winner, got.rule, got.quality) == (2, WinnerMode.BEST, 0.3)
    assert got.fallback_reason is not None and got.fallback_reason.startswith("2 of 3")


def test_expired_wait_with_nothing_judged_falls_back_to_ranked() -> None:
    got = decide([FAIL, OK, OK], now=11.0, until=10.0)
    assert (got.winner, got.rule, got.fallback_reason) == (1, WinnerMode.RANKED, NONE_JUDGED)


def test_an_unscorable_output_is_not_waited_for() -> None:
    # The judge answered for rank 0 without a score: nothing left to wait for.
    got = decide([OK, OK], {0: None, 1: 0.4}, now=0.0, until=10.0)
    assert (got.decided, got.winner, got.rule) == (True, 1, WinnerMode.BEST)
    assert got.fallback_reason is not None and got.fallback_reason.startswith("1 of 2")
    none = decide([OK], {0: None}, now=0.0, until=10.0)
    assert (none.winner, none.rule, none.fallback_reason) == (0, WinnerMode.RANKED, NONE_JUDGED)


@pytest.mark.parametrize("now", [0.0, 5.0, 9.999])
def test_a_complete_judgement_never_waits(now: float) -> None:
    got = decide([OK, FAIL, OK], {0: 0.1, 2: 0.8}, now=now, until=10.0)
    assert (got.decided, got.winner) == (True, 2)
