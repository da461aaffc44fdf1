"""The link's RTT in the allocation rule's T (real mode, spec §13): counted only with
``PolicyParams.use_rtt`` (off by default, so the simulator's figures stay the paper's),
built from the link profiles' RTT moments, and switched on per role by the pool config."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from coordinator.config import HacoSettings
from coordinator.core.evidence import PoolMember, build_arrays, link_id
from coordinator.core.params import PolicyParams, ProfileSettings
from coordinator.core.policy import CandidateArrays, allocate, validate
from coordinator.core.profiles import LinkObservation, LinkProfile, update_link
from coordinator.errors import PolicyError
from coordinator.runtime.pool import Pool
from schemas.enums import LaunchMode
from schemas.models import BackendSpec, Candidate, Message, RoleInvocation
from schemas.pool import PoolConfig, RoleDefaults

COLS = {
    "alpha": [3.0, 3.0],
    "beta": [1.0, 1.0],
    "f_int": [0.0, 0.0],
    "loss": [0.0, 0.0],
    "t_proc_s": [1.0, 1.2],
    "bytes": [1000.0, 1000.0],
    "bandwidth_Bps": [1e5, 1e5],
    "jitter_Bps": [0.0, 0.0],
}


def test_rtt_is_ignored_by_default() -> None:
    with_rtt = CandidateArrays.from_columns(**COLS, rtt_s=[2.0, 0.0])
    without = CandidateArrays.from_columns(**COLS)
    a, b = allocate(with_rtt, PolicyParams()), allocate(without, PolicyParams())
    np.testing.assert_array_equal(a.T_s, b.T_s)
    np.testing.assert_array_equal(a.order, b.order)


def test_use_rtt_adds_the_links_rtt_to_t() -> None:
    stats = CandidateArrays.from_columns(**COLS, rtt_s=[2.0, 0.0])
    params = PolicyParams(use_rtt=True)
    alloc = allocate(stats, params)
    np.testing.assert_allclose(alloc.T_s, [1.0 + 2.0 + 0.01, 1.2 + 0.0 + 0.01])
    assert list(alloc.order) == [1, 0]  # the far endpoint now ranks second
    assert list(allocate(stats, PolicyParams()).order) == [0, 1]


def test_use_rtt_without_rtt_arrays_is_the_plain_rule() -> None:
    stats = CandidateArrays.from_columns(**COLS)
    a, b = allocate(stats, PolicyParams(use_rtt=True)), allocate(stats, PolicyParams())
    np.testing.assert_array_equal(a.T_s, b.T_s)


@pytest.mark.parametrize("bad", [[-0.1, 0.0], [float("nan"), 0.0], [float("inf"), 0.0]])
def test_bad_rtt_is_rejected(bad: list[float]) -> None:
    with pytest.raises(PolicyError, match="rtt_s"):
        CandidateArrays.from_columns(**COLS, rtt_s=bad)


def test_rtt_of_the_wrong_length_is_rejected() -> None:
    with pytest.raises(PolicyError, match="rtt_s"):
        CandidateArrays.from_columns(**COLS, rtt_s=[0.1])
    stats = CandidateArrays.from_columns(**COLS)
    object.__setattr__(stats, "rtt_s", np.zeros(3))
    with pytest.raises(PolicyError, match="rtt_s"):
        validate(stats)


def _link(src: str, dst: str, *rtts: float) -> LinkProfile:
    prof = LinkProfile(src, dst)
    for i, r in enumerate(rtts):
        obs = LinkObservation(float(i), 100.0, False, None, r)
        prof = update_link(prof, obs, ProfileSettings())
    return prof


def test_build_arrays_reads_the_links_mean_rtt() -> None:
    pool = [PoolMember("a", "east"), PoolMember("b", "west"), PoolMember("c", "north")]
    links = {
        link_id("local", "east"): _link("local", "east", 0.1, 0.3),
        link_id("local", "west"): _link("local", "west", 0.5),
    }
    stats = build_arrays(pool, "local", {}, links, 100.0, ProfileSettings())
    assert stats.rtt_s is not None
    # north has no RTT: the median of the pool's known ones, (0.2 + 0.5) / 2
    np.testing.assert_allclose(stats.rtt_s, [0.2, 0.5, 0.35])
    cold = build_arrays(pool, "local", {}, {}, 100.0, ProfileSettings())
    assert cold.rtt_s is not None
    np.testing.assert_array_equal(cold.rtt_s, [0.0, 0.0, 0.0])


def test_pool_config_switches_rtt_on_per_role() -> None:
    http = BackendSpec(kind="http")
    cands = [Candidate(id="c0", role="coder", model="m", zone="local", backend=http)]
    config = PoolConfig(
        caller_zone="local",
        zones=["local"],
        candidates=cands,
        defaults=RoleDefaults(use_rtt=True),
        roles={"coder": RoleDefaults(tau=0.8)},
    )
    inv = RoleInvocation(role="coder", payload=[Message(role="user", content="x")])
    call = Pool(config).call_settings(inv, HacoSettings(), PolicyParams())
    assert call.params.use_rtt and call.params.tau == 0.8
    plain = PoolConfig(caller_zone="local", zones=["local"], candidates=cands)
    assert not Pool(plain).call_settings(inv, HacoSettings(), PolicyParams()).params.use_rtt


def test_call_settings_follow_each_calls_overrides() -> None:
    # Kept per distinct overrides (Pool.call_settings): a call with other overrides, or
    # under other settings or parameters, gets its own, never another call's.
    http = BackendSpec(kind="http")
    cands = [Candidate(id="c0", role="coder", model="m", zone="local", backend=http)]
    config = PoolConfig(
        caller_zone="local", zones=["local"], candidates=cands,
        roles={"coder": RoleDefaults(tau=0.8)},
    )  # fmt: skip
    pool, settings, params = Pool(config), HacoSettings(), PolicyParams()
    msg = [Message(role="user", content="x")]

    def call(settings: HacoSettings = settings, params: PolicyParams = params, **kw: Any) -> Any:
        return pool.call_settings(RoleInvocation(role="coder", payload=msg, **kw), settings, params)

    assert call().params.tau == 0.8 and call(tau=0.95).params.tau == 0.95
    assert call().params.tau == 0.8  # the role's again, not the last call's
    assert call(deadline_s=3.0).deadline_s == 3.0 and call().deadline_s == 60.0
    assert call(launch_mode=LaunchMode.STAGGERED).launch_mode is LaunchMode.STAGGERED
    assert call().launch_mode is settings.launch_mode
    other = HacoSettings(default_deadline_s=7.0, launch_mode=LaunchMode.STAGGERED)
    assert call(other).deadline_s == 7.0 and call(other).launch_mode is LaunchMode.STAGGERED
    assert call(params=PolicyParams(lam=0.5)).params.lam == 0.5 and call().params.lam == params.lam
