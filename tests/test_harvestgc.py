"""The harvester's garbage collection on a timer (coordinator.tracestore.harvestgc):
Python's automatic collector off inside the block and as it was after, reference cycles
still freed when the clock says so or when young objects pile up."""

from __future__ import annotations

import gc
import weakref

import pytest
from polling import wait_for
from pydantic import ValidationError

from coordinator.config import HacoSettings
from coordinator.tracestore.harvestgc import collected_on_timer


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


def _cycle() -> weakref.ref[_Node]:
    return weakref.ref(_Node())


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_automatic_collector_is_left_alone_with_zero() -> None:
    assert gc.isenabled()
    with collected_on_timer(0.0, 1000):
        assert gc.isenabled()
        assert gc.get_freeze_count() == 0
    assert gc.isenabled()


def test_cycles_are_collected_when_the_clock_says_so() -> None:
    clock = _Clock()
    with collected_on_timer(10.0, 10**9, clock=clock, poll_s=0.01):
        assert not gc.isenabled()
        assert gc.get_freeze_count() > 0  # what was alive before: out of every pass
        ref = _cycle()
        assert ref() is not None  # nothing collects it by itself
        clock.now += 10.0
        wait_for("the timed collection", lambda: ref() is None, timeout_s=30.0)
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_young_objects_piling_up_are_collected_before_the_timer() -> None:
    clock = _Clock()  # never moves: only the count can start a collection
    with collected_on_timer(10.0, 1000, clock=clock, poll_s=0.01):
        refs = [_cycle() for _ in range(3000)]
        wait_for("the collection by count", lambda: all(r() is None for r in refs), timeout_s=30)
    assert gc.isenabled()


def test_the_block_is_undone_when_it_raises() -> None:
    with pytest.raises(RuntimeError, match="boom"), collected_on_timer(5.0, 1000):
        raise RuntimeError("boom")
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_bad_values_are_named() -> None:
    with pytest.raises(ValueError, match=r"-1\.0"), collected_on_timer(-1.0, 1000):
        pass
    with pytest.raises(ValidationError, match="harvest_gc_every_s"):
        HacoSettings(harvest_gc_every_s=-1.0)
    with pytest.raises(ValidationError, match="harvest_gc_max_young"):
        HacoSettings(harvest_gc_max_young=10)
    assert HacoSettings(harvest_gc_every_s=0.0).harvest_gc_every_s == 0.0
