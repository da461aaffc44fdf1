"""How early a backup's timer runs (coordinator.runtime.lead): the median of this
process's recent paths from a timer to a backup's send, and the coordinator that
measures it and hands it to each staggered group's launcher."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from runtime_helpers import (
    RETURNED,
    Runtime,
    ScriptedBackend,
    Step,
    build_runtime,
    invocation,
    small_pool,
)

from coordinator.config import HacoSettings
from coordinator.runtime.lead import LaunchLead
from schemas.enums import LaunchMode, WinnerMode


def test_no_lead_until_enough_paths_then_their_median() -> None:
    lead = LaunchLead(window=5, min_samples=3, max_s=0.01)
    lead.record(0.002)
    lead.record(0.004)
    assert lead.lead_s() == 0.0  # two paths are not evidence yet
    lead.record(0.001)
    assert lead.lead_s() == 0.002
    for _ in range(3):
        lead.record(0.003)
    assert lead.lead_s() == 0.003  # 0.004, 0.001, 0.003 ×3: the window keeps the last 5


def test_a_long_path_is_capped_and_odd_ones_are_ignored() -> None:
    lead = LaunchLead(window=8, min_samples=1, max_s=0.005)
    for path_s in (math.nan, math.inf, -0.001):  # no clock gives one; a clock step
        lead.record(path_s)
    assert len(lead) == 0
    lead.record(0.5)  # a stalled process, not the timer's path
    assert lead.lead_s() == 0.005


def test_no_lead_when_its_cap_is_zero() -> None:
    lead = LaunchLead.of(HacoSettings(launch_lead_max_s=0.0, launch_lead_min_samples=1))
    lead.record(0.002)
    assert lead.lead_s() == 0.0 and len(lead) == 0


@pytest.mark.parametrize(
    ("window", "min_samples", "max_s"), [(0, 1, 0.01), (4, 0, 0.01), (4, 1, -1.0), (4, 1, math.inf)]
)
def test_bad_settings_are_refused(window: int, min_samples: int, max_s: float) -> None:
    with pytest.raises(ValueError, match="expected"):
        LaunchLead(window, min_samples, max_s)


@pytest.fixture
def runtime() -> Iterator[Runtime]:
    # c0 ends only once the caller has its result; c1, the backup, answers at once.
    backend = ScriptedBackend({"c0": Step(0.005, after=(RETURNED,)), "c1": Step(0.005)})
    rt = build_runtime(
        backend, small_pool(2), initial_hedge_delay_s=0.02, launch_lead_min_samples=1
    )
    yield rt
    rt.dispatcher.close()


STAGGERED = {"launch_mode": LaunchMode.STAGGERED, "winner_mode": WinnerMode.FIRST}


def test_a_backup_records_its_path_from_its_timer(runtime: Runtime) -> None:
    coord = runtime.coordinator
    assert len(coord.lead) == 0
    result = runtime.invoke(**STAGGERED)
    assert result.backups == 1 and result.candidate_id == "c1"
    assert len(coord.lead) == 1  # the backup's path: this process's next lead
    assert 0.0 < coord.lead.lead_s() <= coord.settings.launch_lead_max_s


def test_a_staggered_group_gets_the_lead_of_its_process(runtime: Runtime) -> None:
    coord = runtime.coordinator
    for _ in range(coord.settings.launch_lead_min_samples):
        coord.lead.record(0.004)
    g = coord._plan(invocation(**STAGGERED))
    coord._launch_initial(g)
    try:
        assert g.launcher.lead_s == 0.004
        assert g.launcher.wake_at() == g.launched_at[0] + g.launcher.delay_s - 0.004
    finally:
        g.alarm.cancel()
