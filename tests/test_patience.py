"""The give-up clocks of hedge members (coordinator.core.patience), on an injected clock."""

from __future__ import annotations

import math

import pytest

from coordinator.config import HacoSettings
from coordinator.core.patience import Budgets, GaveUp, Watch, patience_s, start_timeout_s
from coordinator.core.winner import Report, verdict
from coordinator.errors import PolicyError
from coordinator.runtime.liveness import QueueWaits
from schemas.enums import WinnerMode


def test_start_timeout_is_the_floor_until_enough_waits() -> None:
    assert start_timeout_s(2.0, 5.0, [0.9] * 19, min_samples=20) == 2.0
    assert start_timeout_s(2.0, 5.0, [0.9] * 20, min_samples=20) == pytest.approx(4.5)
    # Mostly tiny waits: the floor still holds.
    assert start_timeout_s(2.0, 5.0, [0.001] * 100, min_samples=20) == 2.0
    # The p95, not the maximum: one outlier in a hundred moves nothing.
    waits = [0.1] * 99 + [30.0]
    assert start_timeout_s(0.1, 5.0, waits, min_samples=20) == pytest.approx(0.5)


def test_patience_scales_the_processing_estimate_with_a_floor() -> None:
    assert patience_s(1.0, 4.0, 0.01) == 1.0
    assert patience_s(1.0, 4.0, 2.0) == 8.0
    with pytest.raises(PolicyError):
        patience_s(1.0, 4.0, math.nan)


def watch(n: int = 3, start: float = 1.0, patience: float = 2.0) -> Watch:
    return Watch([Budgets(start, patience)] * n)


def test_a_member_not_started_is_given_up_at_its_start_timeout() -> None:
    w = watch()
    w.on_launch(0, 10.0)
    w.on_launch(1, 10.0)
    assert w.wake_at() == 11.0
    assert w.due(10.99) == []
    w.on_started(1, 10.2)
    assert w.due(11.0) == [0]
    assert w.given_up == {0: (GaveUp.NOT_STARTED, 11.0)}
    assert w.due(11.5) == []  # once
    assert w.gave_up_unstarted(0) and not w.gave_up_unstarted(1)
    assert w.wake_at() == 12.2  # rank 1: started at 10.2, patience 2 s


def test_a_started_member_is_given_up_after_its_patience() -> None:
    w = watch(patience=0.5)
    w.on_launch(0, 0.0)
    assert w.on_started(0, 0.3) == pytest.approx(0.3)  # the queue wait
    assert w.on_started(0, 0.4) is None  # a duplicate token
    assert w.give_up_at(0) == 0.8
    assert w.due(0.8) == [0]
    assert w.given_up[0][0] is GaveUp.NO_REPORT


def test_a_report_ends_the_clock_and_replaces_the_assumed_failure() -> None:
    w = watch()
    w.on_launch(0, 0.0)
    w.on_launch(1, 0.0)
    assert w.due(1.0) == [0, 1]
    w.on_report(1)
    assert 1 not in w.given_up
    assert w.give_up_at(1) == math.inf
    got = w.reports([None, Report(1.5, True)], t0_s=0.0)
    assert got == [Report(1.0, False), Report(1.5, True)]


def test_a_member_given_up_unstarted_that_starts_gets_its_patience() -> None:
    w = watch(start=1.0, patience=2.0)
    w.on_launch(0, 0.0)
    assert w.due(1.0) == [0]
    w.on_started(0, 1.2)
    assert 0 not in w.given_up
    assert w.due(3.1) == []
    assert w.due(3.2) == [0]
    assert w.given_up[0][0] is GaveUp.NO_REPORT


def test_unlaunched_members_are_never_given_up() -> None:
    w = watch()
    w.on_launch(0, 0.0)
    assert w.due(100.0) == [0]
    assert w.wake_at() == math.inf
    assert w.give_up_at(2) == math.inf


def test_ranked_rule_stops_waiting_for_a_dark_higher_rank() -> None:
    """Rank 0 never starts (its zone is dark), rank 1 succeeds at 50 ms: the ranked rule
    waits for rank 0 only until its start timeout, then rank 1 wins."""
    w = watch(start=2.0)
    w.on_launch(0, 0.0)
    w.on_launch(1, 0.0)
    w.on_started(1, 0.001)
    reports: list[Report | None] = [None, Report(0.05, True)]
    assert not verdict(WinnerMode.RANKED, w.reports(reports, 0.0)).decided
    w.due(2.0)
    v = verdict(WinnerMode.RANKED, w.reports(reports, 0.0))
    assert (v.decided, v.winner) == (True, 1)


def test_every_member_given_up_is_all_failed_before_the_deadline() -> None:
    w = watch(n=2)
    w.on_launch(0, 0.0)
    w.on_launch(1, 0.0)
    w.due(1.0)
    for mode in WinnerMode:
        if mode is WinnerMode.BEST:
            continue  # its own rule waits for judged outputs (coordinator.core.winner)
        assert verdict(mode, w.reports([None, None], 0.0)).all_failed


def test_watch_needs_a_member() -> None:
    with pytest.raises(PolicyError):
        Watch([])


def test_patience_ends_the_wait_only_with_a_success_in_hand() -> None:
    """A slow, started member is not a failure while nothing has succeeded: patience
    bounds the wait for a better rank, the deadline bounds the group."""
    w = watch(n=2, patience=0.5)
    for rank in (0, 1):
        w.on_launch(rank, 0.0)
        w.on_started(rank, 0.1)
    assert w.due(0.6) == [0, 1]
    nothing: list[Report | None] = [None, None]
    assert w.reports(nothing, 0.0) == [None, None]
    assert not verdict(WinnerMode.RANKED, w.reports(nothing, 0.0)).decided
    # Rank 1 succeeds: rank 0's patience is spent, so the success in hand wins now.
    late = [None, Report(0.9, True)]
    assert w.reports(late, 0.0) == [Report(0.6, False), Report(0.9, True)]
    assert verdict(WinnerMode.RANKED, w.reports(late, 0.0)).winner == 1


def test_a_member_that_never_started_is_a_failure_even_with_nothing_in_hand() -> None:
    w = watch(n=2, start=1.0)
    w.on_launch(0, 0.0)
    w.on_launch(1, 0.0)
    w.on_started(1, 0.1)
    assert w.due(1.0) == [0]
    assert w.reports([None, None], 0.0) == [Report(1.0, False), None]


def test_a_zones_start_timeout_follows_its_last_queue_waits() -> None:
    s = HacoSettings(
        start_timeout_min_s=2.0, start_timeout_factor=5.0, start_wait_min_samples=20,
        start_wait_window=20,
    )  # fmt: skip
    waits = QueueWaits(s.start_wait_window)
    assert waits.start_timeout_s("a", s) == 2.0  # no waits yet: the floor
    for _ in range(20):
        waits.record("a", 0.9)
    waits.record("a", math.inf)  # no clock gives one: not counted
    assert waits.start_timeout_s("a", s) == pytest.approx(4.5)  # 5 × p95 of 0.9 s
    assert waits.start_timeout_s("b", s) == 2.0  # per zone
    for _ in range(19):
        waits.record("a", 0.1)  # the window keeps the last 20: one 0.9 s left
    assert waits.start_timeout_s("a", s) == 2.0  # 5 × 0.1 s, under the floor
