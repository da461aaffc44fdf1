"""Launch modes in the simulator (sim.engine.SimOptions, spec hedging.md): the pure
staggered schedule (coordinator.core.stagger.schedule), cancellation, the qualified flag,
the co-failure fold, and the parallel mode's records left as they were. Virtual time
only: no wall-clock assertion."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from coordinator.cli.main import app  # type: ignore[attr-defined]
from coordinator.core.methods import Decision, PoolView
from coordinator.core.stagger import Attempt, LaunchReason, schedule
from coordinator.core.winner import Report, resolve
from coordinator.errors import InputError, PolicyError
from schemas.enums import FailureKind, LaunchMode, StopReason, WinnerMode
from schemas.models import Candidate
from schemas.scenario import Scenario
from sim import runner
from sim.candidates import CallDraw
from sim.engine import SimOptions, Simulation
from sim.memberdraw import cut_tokens
from sim.network import Transmission
from sim.scenario import load_builtin
from sim.workflow import Invocation, State
from sim.world import RequestContext, SimWorld

RANKED, FIRST = WinnerMode.RANKED, WinnerMode.FIRST
OK = True
FAIL = False


@pytest.fixture(scope="module")
def overall() -> Scenario:
    return load_builtin("overall")


# ---------------------------------------------------------------- the pure schedule


def test_replacement_when_every_launched_member_failed() -> None:
    sch = schedule(RANKED, [Attempt(2.0, FAIL), Attempt(3.0, OK)], [10.0])
    assert sch.launch_s == (0.0, 2.0)
    assert sch.reasons == (LaunchReason.INITIAL, LaunchReason.REPLACEMENT)
    assert (sch.winner, sch.at_s, sch.launched) == (1, 5.0, 2)


def test_replacement_waits_for_every_launched_member() -> None:
    # rank 1 (a backup at 5) fails at 6 while rank 0 still runs: no replacement then;
    # rank 0 succeeds at 20, before rank 2's timer (5 + 100): rank 2 never starts.
    attempts = [Attempt(20.0, OK), Attempt(1.0, FAIL), Attempt(1.0, OK)]
    sch = schedule(RANKED, attempts, [5.0, 100.0])
    assert sch.launch_s == (0.0, 5.0, None)
    assert (sch.winner, sch.at_s) == (0, 20.0)


def test_backup_on_delay_and_winner_rules() -> None:
    attempts = [Attempt(10.0, OK), Attempt(3.0, OK)]
    ranked = schedule(RANKED, attempts, [4.0])
    assert ranked.launch_s == (0.0, 4.0)
    assert ranked.reasons[1] is LaunchReason.BACKUP
    assert (ranked.winner, ranked.at_s) == (0, 10.0)  # rank 0 launched: it blocks rank 1
    first = schedule(FIRST, attempts, [4.0])
    assert (first.winner, first.at_s) == (1, 7.0)
    assert first.running_at_resolution(attempts) == (0,)


def test_no_launch_after_a_win() -> None:
    attempts = [Attempt(2.0, OK), Attempt(1.0, OK), Attempt(1.0, OK)]
    sch = schedule(RANKED, attempts, [5.0, 5.0])
    assert sch.launch_s == (0.0, None, None)
    assert (sch.winner, sch.at_s, sch.launched) == (0, 2.0, 1)
    # A success at the timer's very expiry stops the backup (reports come first).
    tie = schedule(RANKED, attempts, [2.0, 2.0])
    assert tie.launch_s == (0.0, None, None)
    # A later rank's success stops further backups; rank 0 still decides.
    later = schedule(RANKED, [Attempt(9.0, FAIL), Attempt(1.0, OK), Attempt(1.0, OK)], [1.0, 1.0])
    assert later.launch_s == (0.0, 1.0, None)
    assert (later.winner, later.at_s) == (1, 9.0)


def test_deadline_stops_launches_and_times_members_out() -> None:
    # rank 1 launches at 25 and would report at 35 > 30: both time out at the deadline.
    attempts = [Attempt(50.0, OK), Attempt(10.0, OK)]
    sch = schedule(RANKED, attempts, [25.0], deadline_s=30.0)
    assert sch.launch_s == (0.0, 25.0)
    assert sch.late == (True, True)
    assert (sch.winner, sch.at_s) == (None, 30.0)
    # A timer expiring at the deadline launches nothing.
    none = schedule(RANKED, attempts, [30.0], deadline_s=30.0)
    assert none.launch_s == (0.0, None)
    assert (none.winner, none.at_s) == (None, 30.0)
    # No replacement at or after the deadline either.
    failed = schedule(RANKED, [Attempt(30.0, FAIL), Attempt(1.0, OK)], [99.0], deadline_s=30.0)
    assert failed.launch_s == (0.0, None)
    assert failed.winner is None
    # A report exactly at the deadline is in time (as resolve counts it).
    exact = schedule(RANKED, [Attempt(30.0, OK)], [], deadline_s=30.0)
    assert (exact.winner, exact.late) == (0, (False,))


def test_all_failed_after_every_rank_launched() -> None:
    sch = schedule(RANKED, [Attempt(1.0, FAIL), Attempt(2.0, FAIL)], [9.0])
    assert sch.launch_s == (0.0, 1.0)
    assert (sch.winner, sch.at_s) == (None, 3.0)


@pytest.mark.parametrize("mode", [RANKED, FIRST, WinnerMode.BEST])
def test_zero_delays_are_the_parallel_launch(mode: WinnerMode) -> None:
    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(1, 6))
        dur = rng.choice([1.0, 2.0, 3.0, 40.0], size=n)  # ties included
        ok = rng.random(n) < 0.6
        q = rng.random(n)
        attempts = [
            Attempt(float(d), bool(s), float(x)) for d, s, x in zip(dur, ok, q, strict=True)
        ]
        reports = [Report(a.duration_s, a.success, a.quality) for a in attempts]
        sch = schedule(mode, attempts, [0.0] * n, deadline_s=30.0)
        res = resolve(mode, reports, 30.0)
        assert sch.launch_s == (0.0,) * n
        assert (sch.winner, sch.at_s) == (res.winner, res.at_s)


def test_schedule_rejects_bad_input() -> None:
    with pytest.raises(PolicyError, match="no attempts"):
        schedule(RANKED, [], [])
    with pytest.raises(PolicyError, match="delays"):
        schedule(RANKED, [Attempt(1.0, OK), Attempt(1.0, OK)], [])
    with pytest.raises(PolicyError, match="non-negative"):
        schedule(RANKED, [Attempt(1.0, OK), Attempt(1.0, OK)], [-1.0])
    with pytest.raises(InputError, match="stagger_percentile"):
        SimOptions(LaunchMode.STAGGERED, 101.0)
    assert SimOptions("staggered", 90.0, cancel_losers=True).label == "staggered-p90+cancel"  # type: ignore[arg-type]


# ---------------------------------------------------------------- parallel mode unchanged


def _records(scenario: Scenario, method: str, **kw: object) -> tuple[runner.RunResult, Simulation]:
    captured: list[Simulation] = []
    orig = runner.summarize

    def grab(*args: object) -> runner.RunResult:
        captured.append(args[-1])  # type: ignore[arg-type]
        return orig(*args)  # type: ignore[arg-type]

    runner.summarize = grab  # type: ignore[assignment]
    try:
        res = runner.run(scenario, method, **kw)  # type: ignore[arg-type]
    finally:
        runner.summarize = orig
    return res, captured[0]


# Digests of (task, role, members, zones, winner_zone, all_failed, tokens, judge_tokens,
# latency_s, p_success) of seed 5, 12 tasks, taken before launch modes existed. haco
# itself is not pinned: its co-failure evidence now feeds the decision (issue 10).
PARALLEL_DIGESTS = {
    "random": (172, "39e3a6ac0c656fdb"),
    "bestone": (174, "a5ba71b210c0c1af"),
    "moa": (111, "2cfffd6f7f4d4664"),
    "haco-indep": (140, "da4eec1217237409"),
}


@pytest.mark.parametrize("method", sorted(PARALLEL_DIGESTS))
def test_parallel_records_unchanged(overall: Scenario, method: str) -> None:
    res, sim = _records(overall, method, seed=5, tasks=12)
    rows = [
        (r.task, r.role, r.members, r.zones, r.winner_zone, r.all_failed, r.tokens,
         r.judge_tokens, round(r.latency_s, 9), round(r.p_success, 12))
        for r in sim.records
    ]  # fmt: skip
    digest = hashlib.sha256(repr(rows).encode()).hexdigest()[:16]
    assert (len(rows), digest) == PARALLEL_DIGESTS[method]
    assert all(r.launched == len(r.members) and r.cancelled == 0 for r in sim.records)
    assert res.launch == "parallel" and res.mean_launched == pytest.approx(res.mean_hedge_size)


# ---------------------------------------------------------------- one group, scripted


def _draw(
    total: float, ok: bool = True, quality: float = 0.9, t_req: float = 0.1, tokens_out: int = 50
) -> CallDraw:
    req = Transmission(400.0, False, t_req, 0.01, t_req - 0.01)
    resp = Transmission(200.0, False, t_req, 0.01, t_req - 0.01) if ok else None
    proc = total - (2 * t_req if ok else t_req)
    return CallDraw(
        total, None if ok else FailureKind.INTERNAL, req, resp, proc, 100,
        tokens_out if ok else 0, quality if ok else None,
    )  # fmt: skip


class Fixed:
    """A method that always decides the first ``size`` candidates of the pool."""

    name = "fixed-set"

    def __init__(self, size: int) -> None:
        self.size = size

    def decide(self, view: PoolView, rng: np.random.Generator) -> Decision:
        return Decision(tuple(range(self.size)), 0.5, StopReason.TARGET_REACHED, RANKED)


def _scripted(
    overall: Scenario, draws: list[CallDraw], options: SimOptions | None = None
) -> tuple[Simulation, list[str]]:
    world = SimWorld(overall)
    pools: dict[str, list[Candidate]] = {}
    for c in overall.candidates:
        pools.setdefault(c.role, []).append(c)
    sim = Simulation(world, pools, Fixed(len(draws)), np.random.default_rng(0), options=options)
    by_id = {c.id: d for c, d in zip(pools["coder"], draws, strict=False)}

    def call(
        c: Candidate, nbytes: float, rng: np.random.Generator, ctx: RequestContext | None = None
    ) -> CallDraw:
        return by_id[c.id]

    world.call = call  # type: ignore[method-assign,assignment]
    harvested: list[str] = []
    real = sim._harvest

    def harvest(cand: Candidate, *rest: object) -> None:
        harvested.append(cand.id)
        real(cand, *rest)  # type: ignore[arg-type]

    sim._harvest = harvest  # type: ignore[method-assign,assignment]
    return sim, harvested


def _invoke(sim: Simulation) -> None:
    sim.invoke(Invocation("coder", State.APPEND_CODE, 2000))
    sim.finish()


def test_cut_tokens_rule() -> None:
    d = _draw(50.0)  # request 0.1 s, processing 49.8 s, response 0.1 s
    assert cut_tokens(d, 0.05) == 0  # the request had not arrived
    assert cut_tokens(d, 0.1) == 100  # arrived, nothing processed
    assert cut_tokens(d, 0.1 + 49.8 / 2) == 125  # half the output
    assert cut_tokens(d, 49.95) == 150  # processing done, response in flight
    assert cut_tokens(_draw(50.0, ok=False), 10.0) == 100  # a failing call outputs nothing


def test_cancellation_prorates_tokens_and_does_not_harvest(overall: Scenario) -> None:
    draws = [_draw(5.0), _draw(50.0), _draw(2.0, ok=False)]
    kept, kept_harvest = _scripted(overall, draws)
    _invoke(kept)
    rec = kept.records[-1]
    assert (rec.winner_zone, rec.latency_s, rec.tokens, rec.cancelled) == (
        kept.pools["coder"][0].zone, 5.0, 400, 0,
    )  # fmt: skip
    assert len(kept_harvest) == 3
    cut, cut_harvest = _scripted(overall, draws, SimOptions(cancel_losers=True))
    _invoke(cut)
    rec = cut.records[-1]
    expected_out = round(50 * (5.0 - 0.1) / (50.0 - 0.2))
    assert rec.tokens == 150 + 100 + 100 + expected_out
    assert (rec.launched, rec.cancelled, rec.latency_s) == (3, 1, 5.0)
    ids = [c.id for c in cut.pools["coder"]]
    assert sorted(cut_harvest) == sorted([ids[0], ids[2]])  # the cancelled one is no trace
    assert set(cut.candidates) == {ids[0], ids[2]}
    assert rec.judge_tokens == 50 + cut.world.evaluator_tokens_per_output()
    pairs = cut.cofailure.pairs
    assert list(pairs) == [tuple(sorted((ids[0], ids[2])))]


def test_staggered_group_launches_one_member_when_it_succeeds(overall: Scenario) -> None:
    opts = SimOptions(LaunchMode.STAGGERED, 90.0, cold_delay_s=10.0)
    sim, harvested = _scripted(overall, [_draw(5.0), _draw(3.0), _draw(1.0)], opts)
    _invoke(sim)
    rec = sim.records[-1]
    ids = [c.id for c in sim.pools["coder"]]
    assert (rec.launched, rec.tokens, rec.latency_s, rec.members) == (1, 150, 5.0, tuple(ids[:3]))
    assert harvested == [ids[0]]
    # The window now knows the candidate's end-to-end latency; a cold candidate of the
    # pool takes the option's delay, or without it the median of the known ones.
    assert sim.hedge_delay_s("coder", sim.pools["coder"][0]) == 5.0
    assert sim.hedge_delay_s("coder", sim.pools["coder"][1]) == 10.0
    warm = Simulation(sim.world, sim.pools, Fixed(1), np.random.default_rng(0))
    warm.options = SimOptions(LaunchMode.STAGGERED, 90.0)
    warm.e2e_latency_s = sim.e2e_latency_s
    assert warm.hedge_delay_s("coder", sim.pools["coder"][1]) == 5.0
    empty = Simulation(sim.world, sim.pools, Fixed(1), np.random.default_rng(0))
    assert empty.hedge_delay_s("coder", sim.pools["coder"][1]) == 0.0  # launch at once


def test_staggered_replacement_in_the_engine(overall: Scenario) -> None:
    opts = SimOptions(LaunchMode.STAGGERED, 90.0, cold_delay_s=100.0)
    sim, harvested = _scripted(overall, [_draw(2.0, ok=False), _draw(3.0), _draw(1.0)], opts)
    _invoke(sim)
    rec = sim.records[-1]
    assert (rec.launched, rec.latency_s, rec.all_failed) == (2, 5.0, False)
    assert len(harvested) == 2


# ---------------------------------------------------------------- qualified answers


@pytest.mark.parametrize(
    ("draws", "options", "qualified", "winner_qualified"),
    [
        # A loser's qualified answer within the deadline counts; the winner's does not.
        ([_draw(5.0, quality=0.0), _draw(50.0, quality=1.0)], None, True, False),
        # ... unless it was cancelled (no answer) ...
        ([_draw(5.0, quality=0.0), _draw(50.0, quality=1.0)], SimOptions(cancel_losers=True),
         False, False),
        # ... or late (a timeout, deadline 120 s).
        ([_draw(5.0, quality=0.0), _draw(130.0, quality=1.0)], None, False, False),
        ([_draw(5.0, quality=1.0), _draw(2.0, ok=False)], None, True, True),
        ([_draw(5.0, ok=False), _draw(2.0, ok=False)], None, False, False),
    ],
)  # fmt: skip
def test_qualified_flag(
    overall: Scenario,
    draws: list[CallDraw],
    options: SimOptions | None,
    qualified: bool,
    winner_qualified: bool,
) -> None:
    sim, _ = _scripted(overall, draws, options)
    _invoke(sim)
    rec = sim.records[-1]
    assert (rec.qualified, rec.winner_qualified) == (qualified, winner_qualified)
    assert rec.stop == "target_reached"
    assert rec.p_success_indep == rec.achievable == 0.5  # no allocation: p_success


def test_qualified_rates_in_a_run(overall: Scenario) -> None:
    """The verdicts come from ctx_rng (the main stream's draws are pinned above)."""
    res, sim = _records(overall, "haco-indep", seed=1, tasks=8)
    assert 0.0 < res.winner_qualified_pct <= res.qualified_pct <= 100.0
    assert all(r.qualified for r in sim.records if r.winner_qualified)
    assert not any(r.qualified for r in sim.records if r.launched == 1 and r.all_failed)


# ---------------------------------------------------------------- co-failure evidence


def test_cofailure_evidence_accumulates_in_a_hedged_run(overall: Scenario) -> None:
    _, sim = _records(overall, "haco", seed=0, tasks=10)
    pairs = sim.cofailure.pairs
    assert pairs, "a hedged run folds its groups"
    hedged = sum(1 for r in sim.records if r.launched > 1)
    assert hedged > 0
    assert max(p.n for p in pairs.values()) >= 2
    assert all(a < b for a, b in pairs)
    roles = {c.id: c.role for c in overall.candidates}
    assert all(roles[a] == roles[b] for a, b in pairs)  # pairs come from one group


def test_staggered_cancel_run_invariants(overall: Scenario) -> None:
    opts = SimOptions(LaunchMode.STAGGERED, 75.0, cancel_losers=True)
    res, sim = _records(overall, "haco", seed=2, tasks=15, options=opts)
    assert res.launch == "staggered-p75+cancel"
    for r in sim.records:
        assert 1 <= r.launched <= len(r.members)
        assert r.cancelled < r.launched or r.all_failed
        assert r.tokens >= 0 and r.judge_tokens >= 0
    assert res.mean_launched < res.mean_hedge_size
    par = runner.run(overall, "haco", seed=2, tasks=15)
    assert res.tokens_k_per_task < par.tokens_k_per_task


def test_moa_stays_parallel_and_full(overall: Scenario) -> None:
    opts = SimOptions(LaunchMode.STAGGERED, 50.0, cancel_losers=True)
    res, sim = _records(overall, "moa", seed=0, tasks=5, options=opts)
    base, _ = _records(overall, "moa", seed=0, tasks=5)
    assert all(r.launched == len(r.members) and r.cancelled == 0 for r in sim.records)
    assert res.tokens_k_per_task == base.tokens_k_per_task


# ---------------------------------------------------------------- haco bench frontier


def test_bench_frontier_cli_writes_json_and_plot(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["bench", "frontier", "--tasks", "3", "--seeds", "1", "--workers", "1"]
    res = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report == json.loads((out / "frontier.json").read_text(encoding="utf-8"))
    assert (out / "frontier.png").stat().st_size > 0
    rows = {r["config"]: r for r in report["rows"]}
    assert len(rows) == 11 and rows["moa"]["tokens_over_moa"] == 1.0
    assert {"parallel (paper)", "parallel+cancel", "staggered p95+cancel"} <= set(rows)
    for r in rows.values():
        assert r["judge_tokens_k_per_task"] > 0.0  # the evaluator's column is there
        assert r["meets_goal"] == (
            r["method"] != "moa" and r["tokens_over_moa"] <= 0.35 and r["all_failed_pct"] <= 0.4
        )
    assert sum(r["chosen_default"] for r in rows.values()) == (report["chosen_default"] is not None)
