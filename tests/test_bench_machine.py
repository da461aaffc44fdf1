"""The machine stamp every bench records (bench/machine.py): what a run's figures are
compared knowing."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

from bench.machine import after, machine, machine_busy_s, named_cpu_s, proc_cpu_s, python_loop_ms


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


def test_a_name_sums_its_live_processes_and_is_none_when_none_runs() -> None:
    comm = Path(f"/proc/{os.getpid()}/comm").read_text(encoding="ascii").strip()
    own = proc_cpu_s(os.getpid())  # first: the sum read after it holds at least this
    mine = named_cpu_s(comm)
    assert mine is not None and mine >= own  # this process among them
    assert named_cpu_s("no-such-process") is None


def test_the_machine_busy_time_grows_by_at_least_this_process_work() -> None:
    busy0, own0 = machine_busy_s(), proc_cpu_s(os.getpid())
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # 0.3 s of CPU, however long it takes
        pass
    busy, own = machine_busy_s() - busy0, proc_cpu_s(os.getpid()) - own0
    assert busy >= own - 0.05  # both in clock ticks (10 ms); the machine's holds ours
