"""The coordinator end to end on the in-process backend (MemoryStore + ThreadDispatcher +
MemoryBudget + MemoryDelayWindow): the same coordinator and member code as in production,
members on threads. The scripted backend (runtime_helpers) makes every member's outcome and
duration explicit; orderings are checked on the events it records, never on wall time."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from runtime_helpers import (
    RETURNED,
    ROLE,
    SLOW,
    Runtime,
    ScriptedBackend,
    Step,
    build_runtime,
    small_pool,
    started,
)

from coordinator.core.evidence import link_id
from coordinator.errors import (
    AllFailedError,
    ConfigError,
    DeadlineError,
    NotIdempotentError,
    UnknownRoleError,
    UnknownZoneError,
    WinnerConflictError,
)
from coordinator.runtime.pool import Pool, default_pool, load_pool, sim_scenario
from schemas.enums import (
    FailureKind,
    GroupSignal,
    GroupState,
    LaunchMode,
    MemberStatus,
    StopReason,
    WinnerMode,
)
from schemas.models import (
    BackendSpec,
    Candidate,
    GroupVerdict,
    MemberReport,
    MemberTask,
    Message,
    RoleInvocation,
)
from schemas.pool import PoolConfig, SimSection
from workers.backends.base import Backend
from workers.backends.simulated import SimBackend

MakeRuntime = Callable[..., Runtime]


@pytest.fixture
def make_runtime() -> Iterator[MakeRuntime]:
    made: list[Runtime] = []

    def make(backend: Backend, pool: Pool | None = None, **overrides: Any) -> Runtime:
        made.append(build_runtime(backend, pool, **overrides))
        return made[-1]

    yield make
    for rt in made:
        rt.dispatcher.close()


def scripted(make_runtime: MakeRuntime, *steps: Step, **overrides: Any) -> Runtime:
    backend = ScriptedBackend({f"c{i}": s for i, s in enumerate(steps)})
    return make_runtime(backend, small_pool(len(steps)), **overrides)


# ---------------------------------------------------------------- (a) ranked winner rule


def test_ranked_success_waits_for_the_failing_rank_zero(make_runtime: MakeRuntime) -> None:
    c0 = Step(0.08, ok=False, after=(("finish", "c1"),))
    rt = scripted(make_runtime, c0, Step(0.005), Step(0.005))
    result = rt.invoke()
    assert [m.candidate_id for m in result.members] == ["c0", "c1", "c2"]
    assert (result.winner_id, result.candidate_id) == (f"{result.group_id}.1", "c1")
    assert result.output == "output of c1"
    assert result.members[0].status is MemberStatus.FAILED  # its report was in at the verdict
    assert result.members[0].reason == "scripted failure of c0"
    assert rt.backend.before(("finish", "c1"), ("finish", "c0"))
    assert rt.backend.before(("finish", "c0"), RETURNED)


def test_ranked_rank_zero_success_beats_a_faster_backup(make_runtime: MakeRuntime) -> None:
    rt = scripted(make_runtime, Step(0.08, after=(("finish", "c1"),)), Step(0.005), Step(0.005))
    result = rt.invoke()
    assert (result.winner_id, result.candidate_id) == (f"{result.group_id}.0", "c0")
    assert result.members[1].status is MemberStatus.SUCCEEDED  # reported first, did not win
    assert rt.backend.before(("finish", "c1"), ("finish", "c0"))
    assert rt.store.winners == {result.group_id: result.winner_id}


# ---------------------------------------------------------------- (b) other winner modes


def test_first_mode_takes_the_first_success(make_runtime: MakeRuntime) -> None:
    late = Step(0.005, after=(RETURNED,))  # ends only once the result is back (or the cap)
    rt = scripted(make_runtime, late, Step(0.005), late)
    result = rt.invoke(winner_mode=WinnerMode.FIRST)
    assert result.candidate_id == "c1"
    assert rt.reports()[0].trace.success  # rank 0 still finished, after the result
    assert rt.backend.before(RETURNED, ("finish", "c0"))


def test_best_mode_waits_for_all_and_takes_the_best_quality(make_runtime: MakeRuntime) -> None:
    rt = scripted(
        make_runtime, Step(0.005, quality=0.4), Step(0.03, quality=0.9), Step(0.01, ok=False)
    )
    result = rt.invoke(winner_mode=WinnerMode.BEST)
    assert (result.candidate_id, result.quality) == ("c1", 0.9)
    statuses = [m.status for m in result.members]
    assert statuses == [MemberStatus.SUCCEEDED, MemberStatus.SUCCEEDED, MemberStatus.FAILED]


# ---------------------------------------------------------------- (c) all failed


@pytest.mark.parametrize("mode", list(WinnerMode))
def test_all_failed_carries_every_members_reason(
    make_runtime: MakeRuntime, mode: WinnerMode
) -> None:
    rt = scripted(make_runtime, *(Step(d, ok=False) for d in (0.005, 0.01, 0.02)))
    with pytest.raises(AllFailedError) as info:
        rt.invoke(winner_mode=mode)
    gid = str(info.value.group_id)
    assert info.value.failures == {f"{gid}.{r}": f"scripted failure of c{r}" for r in range(3)}
    assert rt.store.group_state(gid) is GroupSignal.CANCELLED
    assert rt.store.metrics()["state:all_failed"] == 1


def test_staggered_all_failed_replaces_each_failure(make_runtime: MakeRuntime) -> None:
    rt = scripted(
        make_runtime,
        *(Step(0.005, ok=False) for _ in range(3)),
        budget_burst=0.0,  # replacements are uncharged: an empty budget does not matter
        initial_hedge_delay_s=SLOW,
    )
    with pytest.raises(AllFailedError) as info:
        rt.invoke(launch_mode=LaunchMode.STAGGERED)
    assert len(info.value.failures) == 3
    assert rt.budget.snapshot().spent_backups == 0


# ---------------------------------------------------------------- (d) deadline


def test_deadline_lists_every_member(make_runtime: MakeRuntime) -> None:
    c0 = Step(0.005, ok=False, after=started("c1", "c2"))
    rt = scripted(make_runtime, c0, Step(SLOW), Step(SLOW))
    with pytest.raises(DeadlineError) as info:
        rt.invoke(deadline_s=0.3)
    gid, late = str(info.value.group_id), "no report within deadline_s=0.3"
    assert info.value.deadline_s == 0.3
    assert info.value.failures == {
        f"{gid}.0": "scripted failure of c0",
        f"{gid}.1": late,
        f"{gid}.2": late,
    }
    assert rt.store.group_state(gid) is GroupSignal.CANCELLED
    # The lost members are profiled (a hang counts towards f_int), with a trace (issue 8).
    assert rt.store.candidates["c1"].internal_failures == 1
    rt.reports()
    assert rt.backend.stopped == {"c1", "c2"}  # the cancel flag reached the running members
    lost = [MemberReport.model_validate_json(x).trace for x in rt.store.traces]
    lost = [t for t in lost if t.group_id == gid and t.rank > 0]
    assert sorted((t.rank, t.failure_kind) for t in lost) == [
        (1, FailureKind.TIMEOUT),
        (2, FailureKind.TIMEOUT),
    ]  # once each: the stopped members' own reports were not counted again


# ---------------------------------------------------------------- (e) losers


def test_cancel_losers_stops_them(make_runtime: MakeRuntime) -> None:
    c0 = Step(0.005, after=started("c1", "c2"))  # both losers run when the winner is known
    rt = scripted(make_runtime, c0, Step(SLOW), Step(SLOW), cancel_losers=True)
    result = rt.invoke()
    assert result.candidate_id == "c0"
    assert [m.status for m in result.members[1:]] == [MemberStatus.CANCELLED] * 2
    assert rt.store.group_state(result.group_id) is GroupSignal.CANCELLED
    reports = rt.reports()
    assert [reports[r].trace.status for r in (1, 2)] == [MemberStatus.CANCELLED] * 2
    assert reports[1].trace.failure_reason == "stopped by the cancel flag"
    assert rt.backend.stopped == {"c1", "c2"}


def test_kept_losers_finish_and_are_harvested(make_runtime: MakeRuntime) -> None:
    late = Step(0.005, after=(RETURNED,))
    rt = scripted(make_runtime, Step(0.005), late, late, cancel_losers=False)
    result = rt.invoke()
    assert result.candidate_id == "c0"
    assert rt.store.group_state(result.group_id) is GroupSignal.RESOLVED
    reports = rt.reports()
    assert [reports[r].trace.status for r in (1, 2)] == [MemberStatus.SUCCEEDED] * 2
    assert rt.backend.before(RETURNED, ("finish", "c1"))
    assert rt.backend.stopped == set()
    assert {c: p.calls for c, p in rt.store.candidates.items()} == {"c0": 1, "c1": 1, "c2": 1}


# ---------------------------------------------------------------- (f) never started


def member_task(group_id: str, zone: str = "local") -> MemberTask:
    cand = Candidate(
        id="c0", role=ROLE, model="scripted", zone=zone, backend=BackendSpec(kind="http")
    )
    now = time.time()
    return MemberTask(
        group_id=group_id,
        member_id=f"{group_id}.0",
        rank=0,
        candidate=cand,
        caller_zone="local",
        payload=[Message(role="user", content="hi")],
        deadline_at_s=now + 30.0,
        enqueued_at_s=now,
    )


def test_a_member_of_a_cancelled_or_gone_group_never_starts(make_runtime: MakeRuntime) -> None:
    rt = scripted(make_runtime, Step(0.005))
    rt.store.open_group("g-cancelled", 60.0)
    rt.store.set_group_state("g-cancelled", GroupSignal.CANCELLED, 60.0)
    rt.dispatcher.send("local", member_task("g-cancelled"))
    rt.dispatcher.send("local", member_task("g-gone"))  # never opened (or expired)
    rt.dispatcher.close()
    reports = [f.result().trace for f in rt.dispatcher.futures]
    assert [(t.status, t.failure_reason) for t in reports] == [
        (MemberStatus.CANCELLED, "group cancelled"),
        (MemberStatus.CANCELLED, "group gone"),
    ]
    assert rt.backend.events == []
    assert rt.store.pop_reply("g-cancelled", 0.0) is not None  # the reply still goes back
    assert rt.store.candidates == {}  # nothing learnt from calls that did not happen


def test_queued_members_of_a_cancelled_group_never_start(make_runtime: MakeRuntime) -> None:
    # One worker thread: ranks 1 and 2 queue behind rank 0 until the deadline cancels all.
    rt = scripted(make_runtime, Step(SLOW), Step(0.005), Step(0.005), max_workers=1)
    with pytest.raises(DeadlineError):
        rt.invoke(deadline_s=0.05)
    reports = rt.reports()
    assert rt.backend.events == [("start", "c0"), ("stopped", "c0")]
    assert [reports[r].trace.failure_reason for r in (1, 2)] == ["group cancelled"] * 2


# ---------------------------------------------------------------- (g) idempotency


def test_a_call_not_idempotent_runs_one_member(make_runtime: MakeRuntime) -> None:
    rt = scripted(make_runtime, Step(0.005), Step(0.005), Step(0.005))
    result = rt.invoke(idempotent=False)
    assert [m.candidate_id for m in result.members] == ["c0"]
    rt.reports()
    assert [who for what, who in rt.backend.events if what == "start"] == ["c0"]


def test_hedging_a_call_not_idempotent_is_refused(make_runtime: MakeRuntime) -> None:
    rt = scripted(make_runtime, Step(0.005), Step(0.005))
    with pytest.raises(NotIdempotentError, match="require_hedge"):
        rt.invoke(idempotent=False, require_hedge=True)
    assert rt.backend.events == [] and rt.store.states == {}


def test_an_idempotency_key_commits_once(make_runtime: MakeRuntime) -> None:
    rt = scripted(make_runtime, Step(0.005), Step(0.01), Step(0.015))
    result = rt.invoke(idempotency_key="order-7")
    reports = rt.reports()
    assert rt.backend.commits == [result.winner_id]
    ok = [r for r in reports.values() if r.trace.success]
    assert [r.trace.member_id for r in ok] == [result.winner_id]
    taken = [r.trace.failure_reason for r in reports.values() if not r.trace.success]
    assert taken == [f"idempotency key 'order-7' already taken by {result.winner_id}"] * 2
    # A retry with the same key performs no second side effect.
    with pytest.raises(AllFailedError, match="already taken"):
        rt.invoke(idempotency_key="order-7")
    assert rt.backend.commits == [result.winner_id]


# ---------------------------------------------------------------- (h) roles and zones


def test_an_unknown_role_is_refused(make_runtime: MakeRuntime) -> None:
    rt = scripted(make_runtime, Step(0.005))
    with pytest.raises(UnknownRoleError, match="unknown role 'tester'"):
        rt.coordinator.invoke(RoleInvocation(role="tester", payload=[]))


def test_a_candidate_in_an_unlisted_zone_is_rejected(tmp_path: Path) -> None:
    cand = Candidate(id="x", role=ROLE, model="m", zone="mars", backend=BackendSpec(kind="http"))
    with pytest.raises(ValidationError, match="unknown zone 'mars'"):
        PoolConfig(caller_zone="local", zones=["local"], candidates=[cand])
    path = tmp_path / "pool.toml"
    path.write_text(
        'caller_zone = "local"\nzones = ["local"]\n'
        '[[candidates]]\nid = "x"\nrole = "coder"\nmodel = "m"\nzone = "mars"\n'
        '[candidates.backend]\nkind = "http"\n'
    )
    with pytest.raises(ConfigError, match="unknown zone 'mars'"):
        load_pool(path)


def test_the_dispatcher_refuses_an_unknown_zone(make_runtime: MakeRuntime) -> None:
    rt = scripted(make_runtime, Step(0.005))
    rt.store.open_group("g", 60.0)
    with pytest.raises(UnknownZoneError, match="unknown zone 'mars'"):
        rt.dispatcher.send("mars", member_task("g", zone="mars"))
    assert rt.dispatcher.futures == []


# ---------------------------------------------------------------- (i) staggered launch


def test_staggered_backup_launches_after_the_delay(make_runtime: MakeRuntime) -> None:
    slow = Step(0.005, after=(RETURNED,))
    rt = scripted(make_runtime, slow, Step(0.005), Step(0.005), initial_hedge_delay_s=0.1)
    result = rt.invoke(launch_mode=LaunchMode.STAGGERED, winner_mode=WinnerMode.FIRST)
    assert result.candidate_id == "c1"
    assert result.backups == 1
    assert [m.launched for m in result.members] == [True, True, False]
    assert rt.backend.enqueued["c1"] - rt.backend.enqueued["c0"] >= 0.1
    assert rt.budget.snapshot().spent_backups == 1
    metrics = rt.store.metrics()
    assert (metrics["backups"], metrics["backup_wins"], metrics["hedged"]) == (1, 1, 1)


def test_staggered_reads_the_hedge_delay_after_rank_zero_is_sent(
    make_runtime: MakeRuntime,
) -> None:
    # Rank 0 does not wait for the delay's read: only the backup's timer needs it.
    rt = scripted(make_runtime, Step(0.3), Step(0.005), initial_hedge_delay_s=0.02)
    window, sent_at_read = rt.coordinator.delays, []

    class Noting:
        def record(self, role: str, latency_s: float) -> None:
            window.record(role, latency_s)

        def delay_s(self, role: str) -> float:
            sent_at_read.append(len(rt.dispatcher.futures))
            return window.delay_s(role)

    rt.coordinator.delays = Noting()
    result = rt.invoke(launch_mode=LaunchMode.STAGGERED, winner_mode=WinnerMode.FIRST)
    assert sent_at_read == [1]  # read once, with rank 0 sent
    assert result.candidate_id == "c1" and result.backups == 1  # and its timer used it
    assert rt.backend.enqueued["c1"] - rt.backend.enqueued["c0"] >= 0.02


def test_staggered_fast_rank_zero_needs_no_backup(make_runtime: MakeRuntime) -> None:
    rt = scripted(make_runtime, Step(0.005), Step(0.005), initial_hedge_delay_s=0.5)
    result = rt.invoke(launch_mode=LaunchMode.STAGGERED)
    assert result.candidate_id == "c0" and result.backups == 0
    assert [m.launched for m in result.members] == [True, False]
    assert [m.status for m in result.members] == [MemberStatus.SUCCEEDED, MemberStatus.QUEUED]


def test_staggered_with_an_empty_budget_waits_on_rank_zero(make_runtime: MakeRuntime) -> None:
    rt = scripted(
        make_runtime, Step(0.3), Step(0.005), initial_hedge_delay_s=0.02, budget_burst=0.0
    )
    result = rt.invoke(launch_mode=LaunchMode.STAGGERED, winner_mode=WinnerMode.FIRST)
    assert result.candidate_id == "c0" and result.backups == 0
    assert [m.launched for m in result.members] == [True, False]
    assert rt.budget.snapshot().exhausted == 1
    assert rt.store.metrics()["budget_refused"] == 1


def test_staggered_failure_launches_an_uncharged_replacement(make_runtime: MakeRuntime) -> None:
    rt = scripted(
        make_runtime,
        Step(0.005, ok=False),
        Step(0.005),
        Step(0.005),
        initial_hedge_delay_s=SLOW,
        budget_burst=0.0,
    )
    result = rt.invoke(launch_mode=LaunchMode.STAGGERED)
    assert result.candidate_id == "c1" and result.backups == 0
    assert [m.launched for m in result.members] == [True, True, False]


# ---------------------------------------------------------------- (j) online experience


def test_experience_narrows_the_hedge_set(make_runtime: MakeRuntime) -> None:
    sim = SimBackend(sim_scenario(SimSection(scenario="overall")), time_scale=0.0005, poll_s=0.002)
    rt = make_runtime(sim, Pool(default_pool()))
    sizes, stops = [], []
    for _ in range(30):
        try:
            result = rt.invoke()
        except AllFailedError:
            continue  # rare; the failures are harvested all the same
        sizes.append(len(result.members))
        stops.append(result.stop)
    assert (sizes[0], stops[0]) == (6, StopReason.POOL_EXHAUSTED)  # cold start: the full pool
    assert sizes[-1] < 6 and stops[-1] is StopReason.TARGET_REACHED
    rt.dispatcher.close()
    ids = [c.id for c in rt.coordinator.pool.candidates(ROLE)]
    cands, links = rt.store.load_profiles(
        ids, [link_id("local", z) for z in ("regional", "global")]
    )
    assert all(cands[c].calls > 0 for c in ids)
    assert all(link.transmissions > 0 for link in links.values()) and len(links) == 2


# ---------------------------------------------------------------- (k) verdicts


def verdicts(rt: Runtime) -> dict[str, GroupVerdict]:
    found = [GroupVerdict.model_validate_json(v) for v in rt.store.verdicts]
    return {v.group_id: v for v in found}


def test_every_close_records_the_verdict(make_runtime: MakeRuntime) -> None:
    late = Step(0.005, after=(RETURNED,))
    rt = scripted(make_runtime, Step(0.005, ok=False), Step(0.005), late)
    won = rt.invoke()  # ranked: rank 0's failure is in before rank 1 can win
    v = verdicts(rt)[won.group_id]
    assert (v.state, v.winner_member, v.role) == (GroupState.WON, won.winner_id, ROLE)
    assert (v.p_success, v.stop, v.latency_s) == (won.p_success, won.stop, won.latency_s)
    assert (v.launch_mode, v.winner_mode) == (LaunchMode.PARALLEL, WinnerMode.RANKED)
    counts = (v.planned, v.launched, v.succeeded, v.failed, v.running, v.cancelled)
    assert counts == (3, 3, 1, 1, 1, 0) and v.decided_at_s >= v.started_at_s
    rt.reports()
    failing = scripted(make_runtime, *(Step(0.005, ok=False) for _ in range(2)))
    with pytest.raises(AllFailedError) as info:
        failing.invoke()
    v = verdicts(failing)[str(info.value.group_id)]
    assert (v.state, v.winner_member, v.failed, v.launched) == (GroupState.ALL_FAILED, None, 2, 2)
    slow = scripted(make_runtime, Step(SLOW), Step(SLOW))
    with pytest.raises(DeadlineError) as late_info:
        slow.invoke(deadline_s=0.05)
    v = verdicts(slow)[str(late_info.value.group_id)]
    assert (v.state, v.timed_out, v.launched) == (GroupState.DEADLINE, 2, 2)


def test_a_group_claimed_elsewhere_declares_no_second_winner(make_runtime: MakeRuntime) -> None:
    rt = scripted(make_runtime, Step(0.005), Step(0.005), Step(0.005))
    rt.coordinator.new_id = lambda: "g-fixed"
    assert rt.store.claim_winner("g-fixed", "g-fixed.2", 60.0)  # another process got there
    with pytest.raises(WinnerConflictError) as info:
        rt.invoke()
    assert (info.value.winner, info.value.holder) == ("g-fixed.0", "g-fixed.2")
    assert rt.store.winners == {"g-fixed": "g-fixed.2"}
    assert rt.store.verdicts == [] and rt.store.metrics() == {}  # nothing of ours recorded
