"""The machine stamp every bench records (bench/machine.py): what a run's figures are
compared knowing."""

from __future__ import annotations

import math
import os

from bench.machine import after, machine, proc_cpu_s, python_loop_ms


def test_a_stamp_holds_the_cores_load_and_python_speed_before_and_after() -> None:
    before = machine()
    assert before["cpus"] == os.cpu_count()
    assert len(before["loadavg"]) == 3 and before["python_loop_ms"] > 0
    stamped = after(before)
    assert {k: stamped[k] for k in before} == before  # what was stamped before stays
    assert len(stamped["loadavg_after"]) == 3 and stamped["python_loop_ms_after"] > 0


def test_the_python_speed_is_the_fastest_of_its_loops_in_ms() -> None:
    # A thousand-fold longer loop takes longer: the figure is a time, not a rate.
    assert python_loop_ms(n=1_000, tries=1) < python_loop_ms(n=1_000_000, tries=1)


def test_a_process_cpu_is_read_from_proc_and_nan_when_it_is_gone() -> None:
    assert proc_cpu_s(os.getpid()) > 0
    assert math.isnan(proc_cpu_s(2**22 + 1))  # above any pid the kernel allows (2**22)
