"""Members that never start or never report (issue 8), on the in-process runtime: the
group ends without waiting for its deadline, the loss is recorded once (with a trace) and
the candidate or its zone leaves later hedge sets."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from polling import wait_for
from runtime_helpers import ROLE, Runtime, ScriptedBackend, Step, build_runtime, invocation

from coordinator.core.evidence import link_id
from coordinator.runtime.dispatch import ThreadDispatcher
from coordinator.runtime.pool import Pool
from schemas.enums import FailureKind, GroupState, MemberStatus
from schemas.models import BackendSpec, Candidate, MemberReport, MemberTask, MemberTrace
from schemas.pool import PoolConfig
from workers.backends.base import BackendResult, StopCheck

DEADLINE_S = 3.0  # every group below ends long before it, or the test fails


class DarkDispatcher(ThreadDispatcher):
    """Tasks for a dark zone wait in its "queue" (no worker consumes it) until
    :meth:`light` sends them to workers after all."""

    def __init__(self, inner: ThreadDispatcher, dark: set[str]) -> None:
        super().__init__(inner.run, inner.zones, 16)
        self.dark = dark
        self.held: list[MemberTask] = []

    def send(self, zone: str, task: MemberTask) -> None:
        if zone in self.dark:
            self.held.append(task)
        else:
            super().send(zone, task)

    def light(self) -> None:
        self.dark.clear()
        for task in self.held:
            super().send(task.candidate.zone, task)
        self.held.clear()


def pool(zones: list[str]) -> Pool:
    """Candidates c<i> in ``zones[i]``; a cold pool keeps pool order as rank order."""
    cands = [
        Candidate(id=f"c{i}", role=ROLE, model="m", zone=z, backend=BackendSpec(kind="http"))
        for i, z in enumerate(zones)
    ]
    return Pool(PoolConfig(caller_zone="local", zones=["local", "remote"], candidates=cands))


def traces(rt: Runtime) -> list[MemberReport]:
    return [MemberReport.model_validate_json(raw) for raw in rt.store.traces]


@pytest.fixture
def dark() -> Iterator[tuple[Runtime, DarkDispatcher]]:
    backend = ScriptedBackend({f"c{i}": Step(0.005) for i in range(3)})
    rt = build_runtime(
        backend, pool(["remote", "local", "local"]), default_deadline_s=DEADLINE_S,
        start_timeout_min_s=0.1,
    )  # fmt: skip
    dispatcher = DarkDispatcher(rt.dispatcher, {"remote"})
    rt.coordinator.dispatcher = dispatcher
    try:
        yield rt, dispatcher
    finally:
        rt.coordinator.close()
        dispatcher.light()
        dispatcher.close()
        rt.dispatcher.close()


def test_a_dark_rank_zero_is_given_up_at_its_start_timeout(
    dark: tuple[Runtime, DarkDispatcher],
) -> None:
    rt, dispatcher = dark
    res = rt.invoke()
    assert res.state is GroupState.WON
    assert res.candidate_id == "c1"  # rank 1: rank 0 was not waited for until the deadline
    lost = res.members[0]
    assert lost.status is MemberStatus.TIMED_OUT
    assert lost.reason is not None and lost.reason.startswith("not started within")
    # The loss is on the link to the dark zone, with a trace for the recompute.
    (t,) = [r.trace for r in traces(rt) if r.trace.member_id == lost.member_id]
    assert (t.failure_kind, t.lost, t.status) == (FailureKind.NETWORK, True, MemberStatus.TIMED_OUT)
    cands, links = rt.store.load_profiles(["c0"], [link_id("local", "remote")])
    assert links[link_id("local", "remote")].loss_rate == 1.0
    assert cands["c0"].f_int == 0.0  # the service never saw the call
    # The zone comes back: the member declared lost never runs, and is not counted twice.
    dispatcher.light()
    dispatcher.close()
    assert [r.trace.member_id for r in traces(rt)].count(lost.member_id) == 1
    late = [f.result() for f in dispatcher.futures]
    (never,) = [r for r in late if r.trace.member_id == lost.member_id]
    assert never.trace.failure_kind is FailureKind.CANCELLED
    assert never.trace.failure_reason == "declared lost: not started within the start timeout"


def test_a_zone_back_before_the_close_does_not_run_what_was_declared_lost() -> None:
    backend = ScriptedBackend({"c0": Step(0.001), "c1": Step(0.3), "c2": Step(0.3)})
    rt = build_runtime(
        backend, pool(["remote", "local", "local"]), default_deadline_s=DEADLINE_S,
        start_timeout_min_s=0.05,
    )  # fmt: skip
    dispatcher = DarkDispatcher(rt.dispatcher, {"remote"})
    rt.coordinator.dispatcher = dispatcher
    back = threading.Timer(0.15, dispatcher.light)  # after the give-up, before the close
    try:
        back.start()
        res = rt.invoke()
        back.join()
        assert res.candidate_id == "c1"
        lost = res.members[0]
        assert lost.status is MemberStatus.TIMED_OUT
        assert lost.reason is not None and lost.reason.startswith("not started within")
        dispatcher.close()
        refused = [f.result() for f in dispatcher.futures]
        assert [r.trace.failure_reason for r in refused if r.trace.rank == 0] == [
            "declared lost: not started within the start timeout"
        ]
        assert ("start", "c0") not in backend.events
        mine = [r.trace for r in traces(rt) if r.trace.member_id == lost.member_id]
        assert [(t.failure_kind, t.lost) for t in mine] == [(FailureKind.NETWORK, True)]
    finally:
        back.cancel()
        rt.coordinator.close()
        dispatcher.light()
        dispatcher.close()
        rt.dispatcher.close()


def test_a_dark_zone_leaves_the_top_ranks_as_evidence_grows(
    dark: tuple[Runtime, DarkDispatcher],
) -> None:
    rt, _ = dark
    results = [rt.invoke() for _ in range(12)]
    assert all(r.state is GroupState.WON and r.zone == "local" for r in results)
    waited = [r.members[0].candidate_id == "c0" for r in results]
    assert waited[0]
    # Once the link's loss is known, c0 ranks below a live candidate: nobody waits for it.
    assert not any(waited[-5:]), waited


def test_a_dark_zone_sits_out_then_is_probed_again() -> None:
    backend = ScriptedBackend({f"c{i}": Step(0.005) for i in range(3)})
    rt = build_runtime(
        backend, pool(["remote", "local", "local"]), default_deadline_s=DEADLINE_S,
        start_timeout_min_s=0.05, dark_zone_cooldown_s=0.3,
    )  # fmt: skip
    dispatcher = DarkDispatcher(rt.dispatcher, {"remote"})
    rt.coordinator.dispatcher = dispatcher
    try:
        first = rt.invoke()
        assert first.members[0].candidate_id == "c0" and first.candidate_id == "c1"
        cooled = rt.invoke()  # its zone sits out: c0 is not even planned
        assert "c0" not in {m.candidate_id for m in cooled.members}
        threading.Event().wait(0.35)  # the cooldown expires: the next plan probes it
        probed = rt.invoke()
        assert "c0" in {m.candidate_id for m in probed.members}

        # Ranked low now (its link lost everything), it was not waited for: its loss is
        # recorded at its start timeout, by the coordinator's deferred check.
        def losses() -> list[MemberTrace] | None:
            got = [r.trace for r in traces(rt) if r.trace.candidate_id == "c0"]
            return got if len(got) >= 2 else None

        lost = wait_for("the probe's loss", losses, 2.0)
        assert len(lost) == 2 and {t.lost for t in lost} == {True}  # two losses, once each
    finally:
        rt.coordinator.close()
        dispatcher.light()
        dispatcher.close()
        rt.dispatcher.close()


class HangingBackend:
    """c0 answers in 2 ms with the best quality until ``hang`` is set, then hangs (until
    cancelled or released); the others answer in 5 ms."""

    def __init__(self) -> None:
        self.hang = False
        self.release = threading.Event()

    def call(self, task: MemberTask, should_stop: StopCheck) -> BackendResult:
        if task.candidate.id != "c0" or not self.hang:
            fast = task.candidate.id == "c0"
            self.release.wait(0.002 if fast else 0.005)
            return BackendResult(
                None, output="ok", quality=0.95 if fast else 0.85,
                proc_latency_s=0.002 if fast else 0.005,
            )  # fmt: skip
        while not self.release.wait(0.002):
            if should_stop():
                return BackendResult(FailureKind.CANCELLED, "stopped by the cancel flag")
        return BackendResult(None, output="late", quality=0.9, proc_latency_s=9.0)

    def commit(self, task: MemberTask) -> None:
        pass


def test_a_candidate_that_always_hangs_loses_its_rho_and_drops_out_of_hedge_sets() -> None:
    backend = HangingBackend()
    deadline_s = 0.3
    rt = build_runtime(
        backend, pool(["local"] * 3), max_workers=64, default_deadline_s=deadline_s,
        patience_min_s=0.02,
    )  # fmt: skip
    try:
        warm = [rt.invoke() for _ in range(8)]
        assert warm[-1].candidate_id == "c0" and warm[-1].members[0].candidate_id == "c0"
        backend.hang = True  # c0, the best-ranked candidate, now hangs on every call
        ends = []
        for _ in range(30):
            res = rt.invoke()
            assert res.state is GroupState.WON and res.candidate_id != "c0"
            ends.append(res)
        # Ranked first, c0 is waited for only until its patience (4 × its 2 ms latency,
        # floor 20 ms), never until the deadline.
        reasons = [m.reason or "" for r in ends for m in r.members if m.candidate_id == "c0"]
        assert any(x.startswith("no report within its patience") for x in reasons), reasons
        assert not any("deadline" in x for x in reasons), reasons
        # Its deferred records (at each group's deadline) count the hangs against it.
        threading.Event().wait(deadline_s + 0.2)
        cands, _ = rt.store.load_profiles(["c0", "c1"], [])
        assert cands["c0"].f_int > 0.3
        assert cands["c1"].f_int == 0.0
        hung = [r.trace for r in traces(rt) if r.trace.failure_kind is FailureKind.TIMEOUT]
        assert hung and {t.candidate_id for t in hung} == {"c0"}
        assert len({t.member_id for t in hung}) == len(hung)  # each member once
        # Its rho fell: it left the hedge sets (or at least their top rank).
        assert all(r.members[0].candidate_id != "c0" for r in ends[-5:])
        last = rt.invoke()
        assert "c0" not in {m.candidate_id for m in last.members}
    finally:
        rt.coordinator.close()
        backend.release.set()
        rt.dispatcher.close()
    # Released, the hung members finished: none of them was counted a second time.
    c0 = [r.trace for r in traces(rt) if r.trace.candidate_id == "c0"]
    assert len({t.member_id for t in c0}) == len(c0)


def test_a_member_that_reports_after_its_patience_still_counts_once() -> None:
    """c0 is slow, not dead: given up by patience, it reports before the deadline, so
    its own outcome is recorded and the coordinator records nothing."""
    backend = ScriptedBackend({"c0": Step(0.15), "c1": Step(0.001), "c2": Step(0.001)})
    rt = build_runtime(
        backend, pool(["local"] * 3), default_deadline_s=DEADLINE_S, patience_min_s=0.02
    )
    try:
        rt.invoke()  # warm: c0's latency is now known to the pool
        res = rt.coordinator.invoke(invocation())
        assert res.state is GroupState.WON
        rt.dispatcher.close()
        rt.coordinator.close()
        mine = [r.trace for r in traces(rt) if r.trace.group_id == res.group_id]
        assert sorted(t.rank for t in mine) == sorted({t.rank for t in mine})
        assert all(t.failure_kind is not FailureKind.TIMEOUT for t in mine)
    finally:
        rt.coordinator.close()
        rt.dispatcher.close()
