"""Launch scheduling (coordinator.core.stagger, spec hedging.md "Launch modes"): pure
bookkeeping over explicit times; no clock is read and nothing sleeps."""

from __future__ import annotations

import math

import pytest

from coordinator.core.stagger import Launch, Launcher, LaunchReason
from coordinator.errors import PolicyError
from schemas.enums import LaunchMode

START = 1000.0
DELAY = 0.25


def staggered(size: int = 3, delay: float = DELAY) -> Launcher:
    return Launcher(LaunchMode.STAGGERED, size, delay, START)


def launch_all_due(launcher: Launcher, now: float) -> list[Launch]:
    """What the runtime does at ``now``: launch everything due, in order."""
    done = []
    while (launch := launcher.due(now)) is not None:
        launcher.on_launch(launch, now)
        done.append(launch)
    return done


def start(launcher: Launcher) -> list[Launch]:
    initial = launcher.initial()
    for launch in initial:
        launcher.on_launch(launch, START)
    return initial


# ---------------------------------------------------------------- parallel


def test_parallel_launches_every_member_at_once_and_never_again() -> None:
    launcher = Launcher(LaunchMode.PARALLEL, 4, DELAY, START)
    initial = start(launcher)
    assert [(x.rank, x.reason) for x in initial] == [(r, LaunchReason.INITIAL) for r in range(4)]
    assert not any(x.charged for x in initial)  # the reliability floor is never charged
    assert launcher.launched == 4 and not launcher.pending
    assert launcher.wake_at() == math.inf
    for now in (START, START + DELAY, START + 100 * DELAY):
        assert launcher.due(now) is None
    launcher.on_report(False)  # a failure has no one left to replace it
    assert launcher.due(START + 1.0) is None


def test_parallel_has_no_timer_even_before_launching() -> None:
    launcher = Launcher(LaunchMode.PARALLEL, 3, DELAY, START)
    assert launcher.wake_at() == math.inf


# ---------------------------------------------------------------- staggered timer


def test_staggered_starts_rank_zero_alone() -> None:
    launcher = staggered()
    initial = start(launcher)
    assert initial == [Launch(0, LaunchReason.INITIAL)]
    assert launcher.launched == 1 and launcher.pending


def test_backup_is_due_exactly_at_the_hedge_delay() -> None:
    launcher = staggered()
    start(launcher)
    assert launcher.due(START) is None
    assert launcher.due(START + DELAY - 1e-9) is None
    backup = launcher.due(START + DELAY)
    assert backup == Launch(1, LaunchReason.BACKUP)
    assert backup.charged
    assert launcher.due(START + DELAY) == backup  # asking again does not advance anything


def test_next_backup_is_a_delay_after_the_previous_launch() -> None:
    launcher = staggered(size=3)
    start(launcher)
    late = START + DELAY + 0.1  # the runtime woke late; the next timer runs from here
    assert launch_all_due(launcher, late) == [Launch(1, LaunchReason.BACKUP)]
    assert launcher.wake_at() == late + DELAY
    assert launcher.due(late + DELAY - 1e-9) is None
    assert launcher.due(late + DELAY) == Launch(2, LaunchReason.BACKUP)
    assert launch_all_due(launcher, late + DELAY) == [Launch(2, LaunchReason.BACKUP)]
    assert launcher.due(late + 100.0) is None  # the set is exhausted
    assert launcher.wake_at() == math.inf and not launcher.pending


def test_wake_at_follows_the_last_launch() -> None:
    launcher = staggered()
    assert launcher.wake_at() == START + DELAY  # measured from the group start
    start(launcher)
    assert launcher.wake_at() == START + DELAY
    launch_all_due(launcher, START + DELAY)
    assert launcher.wake_at() == START + 2 * DELAY


def test_a_lead_makes_the_backup_due_that_much_before_its_delay() -> None:
    launcher = staggered(size=3)
    launcher.lead_s = 0.002  # the runtime's wake-up-to-send path, measured
    start(launcher)
    assert launcher.wake_at() == START + DELAY - 0.002
    assert launcher.due(START + DELAY - 0.0021) is None
    assert launcher.due(START + DELAY - 0.002) == Launch(1, LaunchReason.BACKUP)
    sent = START + DELAY  # the send landed on the delay: the next timer runs from it
    launcher.on_launch(Launch(1, LaunchReason.BACKUP), sent)
    assert launcher.wake_at() == sent + DELAY - 0.002


@pytest.mark.parametrize("lead_s", [DELAY * 10, -1.0])
def test_a_lead_stays_within_the_delay(lead_s: float) -> None:
    launcher = staggered()
    launcher.lead_s = lead_s  # longer than the delay: no backup before its predecessor
    start(launcher)
    expected = START if lead_s > 0 else START + DELAY  # a negative lead counts as none
    assert launcher.wake_at() == expected
    assert launcher.due(expected) == Launch(1, LaunchReason.BACKUP)


def test_a_lead_leaves_parallel_and_replacements_alone() -> None:
    launcher = Launcher(LaunchMode.PARALLEL, 2, DELAY, START)
    launcher.lead_s = 0.002
    assert launcher.wake_at() == math.inf
    staggered_ = staggered(size=2)
    staggered_.lead_s = 0.002
    start(staggered_)
    staggered_.on_report(False)  # a failure: its replacement is due at once, uncharged
    assert staggered_.due(START) == Launch(1, LaunchReason.REPLACEMENT)


# ---------------------------------------------------------------- failures, success


def test_a_failure_triggers_an_immediate_uncharged_replacement() -> None:
    launcher = staggered(size=3)
    start(launcher)
    failed_at = START + 0.01  # long before the hedge delay
    launcher.on_report(False)
    replacement = launcher.due(failed_at)
    assert replacement == Launch(1, LaunchReason.REPLACEMENT)
    assert not replacement.charged
    launcher.on_launch(replacement, failed_at)
    assert launcher.due(failed_at) is None  # one failure, one replacement
    assert launcher.replacements == 0
    assert launcher.wake_at() == failed_at + DELAY  # the timer restarts from it


def test_two_failures_replace_two_members() -> None:
    launcher = staggered(size=4)
    start(launcher)
    launch_all_due(launcher, START + DELAY)  # rank 1 as a backup
    launcher.on_report(False)
    launcher.on_report(False)
    assert launch_all_due(launcher, START + DELAY + 0.01) == [
        Launch(2, LaunchReason.REPLACEMENT),
        Launch(3, LaunchReason.REPLACEMENT),
    ]
    assert not launcher.pending


def test_a_failure_of_the_last_member_asks_for_nothing() -> None:
    launcher = staggered(size=2)
    start(launcher)
    launch_all_due(launcher, START + DELAY)
    launcher.on_report(False)
    launcher.on_report(False)
    assert launcher.due(START + 10.0) is None
    assert launcher.replacements == 0 and not launcher.pending


def test_a_success_stops_further_launches() -> None:
    launcher = staggered(size=3)
    start(launcher)
    launcher.on_report(True)
    assert launcher.succeeded and not launcher.pending
    assert launcher.due(START + DELAY) is None
    assert launcher.due(START + 100.0) is None
    assert launcher.wake_at() == math.inf


def test_a_success_after_a_failure_cancels_the_pending_replacement() -> None:
    launcher = staggered(size=3)
    start(launcher)
    launch_all_due(launcher, START + DELAY)
    launcher.on_report(False)
    launcher.on_report(True)
    assert launcher.due(START + DELAY) is None


# ---------------------------------------------------------------- hedge budget


def test_budget_refusal_disables_the_timer_until_a_failure() -> None:
    launcher = staggered(size=3)
    start(launcher)
    refused = launcher.due(START + DELAY)
    assert refused == Launch(1, LaunchReason.BACKUP)
    launcher.on_budget_refused()  # not launched: the bucket was empty
    assert launcher.launched == 1 and not launcher.timer_on
    assert launcher.wake_at() == math.inf
    assert launcher.due(START + 100.0) is None  # the call waits on what runs
    launcher.on_report(False)  # rank 0 failed: the floor needs a replacement
    assert launcher.timer_on
    replacement = launcher.due(START + 100.0)
    assert replacement == Launch(1, LaunchReason.REPLACEMENT)
    launcher.on_launch(replacement, START + 100.0)
    assert launcher.wake_at() == START + 100.0 + DELAY  # the timer is back on


# ---------------------------------------------------------------- size 1


@pytest.mark.parametrize("mode", list(LaunchMode))
def test_size_one_never_launches_a_second_member(mode: LaunchMode) -> None:
    launcher = Launcher(mode, 1, DELAY, START)
    assert start(launcher) == [Launch(0, LaunchReason.INITIAL)]
    assert launcher.wake_at() == math.inf
    for now in (START + DELAY, START + 1000.0):
        assert launcher.due(now) is None
    launcher.on_report(False)
    assert launcher.due(START + 1000.0) is None
    assert launcher.launched == 1 and not launcher.pending


def test_an_empty_group_is_refused() -> None:
    with pytest.raises(PolicyError, match="size=0"):
        Launcher(LaunchMode.STAGGERED, 0, DELAY, START)
