"""bench.ruleab: the coordinator's rule follows the bench's switch between the two
paths, and both give the same decision."""

from __future__ import annotations

import math

import numpy as np

from bench import ruleab
from coordinator.core.methods import PoolView
from coordinator.core.params import PolicyParams
from coordinator.core.policy import CandidateArrays


def view() -> PoolView:
    stats = CandidateArrays.from_columns(
        alpha=[3.0, 1.0, 5.0], beta=[1.0, 2.0, 5.0], f_int=[0.1, 0.0, 0.2],
        loss=[0.01, 0.0, 0.0], t_proc_s=[2.0, 0.5, 1.0], bytes=[500.0, 500.0, 500.0],
        bandwidth_Bps=[1e5, 1e6, math.inf], jitter_Bps=[1e4, 0.0, 0.0],
    )  # fmt: skip
    zeros = np.zeros(3)
    return PoolView(("a", "b", "c"), ("z1", "z2", "z1"), stats, zeros, zeros, zeros)


def test_the_switch_picks_the_path_and_the_decision_is_the_same() -> None:
    class Switch(ruleab._Switch):
        pass

    rule = ruleab._switched(Switch)(PolicyParams(tau=0.8))
    v = view()
    floats = rule.choose(v)  # the runtime's path: no Allocation
    Switch.decide = True
    numpy_path = rule.choose(v)  # Haco.decide's, with every term
    assert floats.allocation is None
    assert numpy_path.allocation is not None
    for field in ("members", "p_success", "stop", "winner_mode", "u_plus", "r_minus"):
        assert getattr(floats, field) == getattr(numpy_path, field), field
