"""The ``best`` rule with unjudged outputs, carried out (coordinator.runtime.judging): the
judged hash and its wake token in both stores, the judge worker writing them, and the
in-process runtime waiting for a scripted judge, or falling back to ``ranked``."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import redis
from runtime_helpers import ROLE, ScriptedBackend, Step, invocation, small_pool

from coordinator.config import HacoSettings
from coordinator.core.judged import NO_EVALUATOR, NONE_JUDGED
from coordinator.runtime.coordinator import WAKE, Coordinator
from coordinator.runtime.dispatch import ThreadDispatcher
from coordinator.runtime.pool import Pool
from coordinator.runtime.ports import RuntimeStore
from coordinator.runtime.results import InvocationResult
from coordinator.state import keys
from coordinator.state.budget import MemoryBudget
from coordinator.state.hedgedelay import MemoryDelayWindow
from coordinator.state.memstore import MemoryStore
from coordinator.state.store import RedisStore
from schemas.enums import WinnerMode
from schemas.models import GroupVerdict, MemberReport, MemberTask, Message
from schemas.pool import JudgeConfig
from workers.backends.base import BackendResult, StopCheck
from workers.judge import CallableScorer, JudgeTask, Outcome, judge_member
from workers.member import MemberContext, execute_member

TTL = 60.0

# ---------------------------------------------------------------- the judged hash


def test_judged_scores_and_wake_tokens(store: RuntimeStore) -> None:
    assert store.judged_scores("g") == {}
    store.record_judged("g", "g.0", 0.25, TTL)
    store.record_judged("g", "g.1", None, TTL)  # judged, no score
    assert store.judged_scores("g") == {"g.0": 0.25, "g.1": None}
    assert store.judged_scores("other") == {}
    assert [store.pop_reply("g", 0.0) for _ in range(3)] == [keys.WAKE, keys.WAKE, None]
    assert keys.WAKE == WAKE  # the coordinator ignores it as it ignores its timers'


def test_the_judged_hash_lives_as_long_as_the_group(redis_db: redis.Redis) -> None:
    RedisStore(redis_db).record_judged("g", "g.0", 0.5, 30.0)
    for key in (keys.group_judged("g"), keys.group_replies("g")):
        assert 0 < int(redis_db.pttl(key)) <= 30_000


# ---------------------------------------------------------------- the judge worker

T0 = 1_700_000_000.25


def test_judge_member_tells_the_group(pg_url: str) -> None:
    store = MemoryStore()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for mid in ("jg.0", "jg.1"):
            conn.execute(
                "INSERT INTO members (member_id, group_id, candidate_id, role, zone,"
                " caller_zone, model, rank, started_at, finished_at, status, latency_s,"
                " stream_id) VALUES (%s, 'jg', 'c0', 'coder', 'local', 'local', 'm', 0,"
                " to_timestamp(%s), to_timestamp(%s), 'succeeded', 0.5, '1-0')",
                (mid, T0 - 1, T0),
            )
        task = JudgeTask(
            member_id="jg.0", candidate_id="c0", finished_at_s=T0, group_id="jg",
            request=[Message(role="user", content="x")], output="out",
        )  # fmt: skip
        done = judge_member(task, Fixed(0.75), store, conn)
        assert done.outcome is Outcome.APPLIED
        assert judge_member(task, Fixed(0.1), store, conn).outcome is Outcome.DUPLICATE
        bad = task.model_copy(update={"member_id": "jg.1"})
        unscored = judge_member(bad, CallableScorer("scorers_example:too_high"), store, conn)
        assert unscored.outcome is Outcome.UNSCORED
    assert store.judged_scores("jg") == {"jg.0": 0.75, "jg.1": None}


class Fixed:
    def __init__(self, q: float) -> None:
        self.q = q

    def score(self, request: list[Message], output: str) -> float:
        return self.q


# ---------------------------------------------------------------- the runtime


class Unjudged(ScriptedBackend):
    """A real backend's outputs: no quality of its own."""

    def call(self, task: MemberTask, should_stop: StopCheck) -> BackendResult:
        return dataclasses.replace(super().call(task, should_stop), quality=None)


class ScriptedJudge:
    """The judge queue, scripted: each enqueued member is scored ``scores[candidate]``
    after ``delay_s`` (a candidate missing from ``scores`` is never judged)."""

    def __init__(self, store: MemoryStore, scores: dict[str, float], delay_s: float) -> None:
        self.store, self.scores, self.delay_s = store, scores, delay_s
        self.sent: list[str] = []
        self._timers: list[threading.Timer] = []

    def __call__(self, task: MemberTask, report: MemberReport) -> None:
        self.sent.append(task.candidate.id)
        q = self.scores.get(task.candidate.id)
        if q is None:
            return
        timer = threading.Timer(
            self.delay_s, self.store.record_judged, (task.group_id, task.member_id, q, TTL)
        )
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def cancel(self) -> None:
        for t in self._timers:
            t.cancel()


@dataclasses.dataclass
class Rig:
    coordinator: Coordinator
    store: MemoryStore
    judge: ScriptedJudge

    def invoke(self, **overrides: Any) -> InvocationResult:
        return self.coordinator.invoke(invocation(**overrides))

    def verdict(self) -> GroupVerdict:
        return GroupVerdict.model_validate_json(self.store.verdicts[-1])


def _pool(evaluator: bool) -> Pool:
    config = small_pool().config
    if evaluator:
        ev = JudgeConfig(scorer="callable", callable="scorers_example:length_score")
        config = config.model_copy(update={"evaluator": ev})
    return Pool(config)


@pytest.fixture
def rig(request: pytest.FixtureRequest) -> Iterator[Rig]:
    params: dict[str, Any] = getattr(request, "param", {})
    settings = HacoSettings(
        default_deadline_s=5.0, cancel_poll_s=0.002,
        best_judge_wait_s=params.get("wait_s", 3.0),
    )  # fmt: skip
    store, delays = MemoryStore(), MemoryDelayWindow(settings)
    backend = Unjudged({f"c{i}": Step(0.01 * (i + 1)) for i in range(3)})
    judge = ScriptedJudge(store, params.get("scores", {}), params.get("delay_s", 0.05))
    ctx = MemberContext(
        store=store, backends=lambda _t: backend, settings=settings, delays=delays, judge=judge
    )
    pool = _pool(params.get("evaluator", True))
    dispatcher = ThreadDispatcher(lambda t: execute_member(t, ctx), pool.zones, 8)
    coord = Coordinator(
        pool, store, dispatcher, MemoryBudget(settings), delays, settings,
    )  # fmt: skip
    yield Rig(coord, store, judge)
    judge.cancel()
    dispatcher.close()
    coord.close()  # no lost-member record fires into a later test's database


@pytest.mark.parametrize("rig", [{"scores": {"c0": 0.2, "c1": 0.9, "c2": 0.5}}], indirect=True)
def test_best_waits_for_a_delayed_judge(rig: Rig) -> None:
    result = rig.invoke(winner_mode=WinnerMode.BEST)
    assert (result.candidate_id, result.quality) == ("c1", 0.9)
    assert (result.winner_rule, result.fallback_reason) == (WinnerMode.BEST, None)
    assert sorted(rig.judge.sent) == ["c0", "c1", "c2"]
    v = rig.verdict()
    assert (v.winner_member, v.winner_rule, v.fallback_reason) == (
        result.winner_id,
        WinnerMode.BEST,
        None,
    )


@pytest.mark.parametrize("rig", [{"evaluator": False}], indirect=True)
def test_best_without_an_evaluator_is_ranked_at_once(rig: Rig) -> None:
    result = rig.invoke(winner_mode=WinnerMode.BEST)
    assert (result.candidate_id, result.quality) == ("c0", None)
    assert (result.winner_rule, result.fallback_reason) == (WinnerMode.RANKED, NO_EVALUATOR)
    assert rig.verdict().fallback_reason == NO_EVALUATOR


@pytest.mark.parametrize("rig", [{"scores": {}, "wait_s": 0.1}], indirect=True)
def test_best_falls_back_to_ranked_when_the_wait_expires(rig: Rig) -> None:
    result = rig.invoke(winner_mode=WinnerMode.BEST)
    assert (result.candidate_id, result.winner_rule) == ("c0", WinnerMode.RANKED)
    assert result.fallback_reason == NONE_JUDGED
    assert rig.verdict().winner_rule is WinnerMode.RANKED


@pytest.mark.parametrize("rig", [{"scores": {"c2": 0.3}, "wait_s": 0.3}], indirect=True)
def test_best_of_the_judged_when_some_never_are(rig: Rig) -> None:
    result = rig.invoke(winner_mode=WinnerMode.BEST)
    assert (result.candidate_id, result.quality, result.winner_rule) == (
        "c2",
        0.3,
        WinnerMode.BEST,
    )
    assert result.fallback_reason is not None and result.fallback_reason.startswith("2 of 3")


@pytest.mark.parametrize("rig", [{"scores": {"c1": 0.9}}], indirect=True)
def test_other_rules_do_not_wait(rig: Rig) -> None:
    result = rig.invoke()
    assert (result.candidate_id, result.winner_rule, result.fallback_reason) == (
        "c0",
        WinnerMode.RANKED,
        None,
    )
    assert rig.verdict().winner_rule is WinnerMode.RANKED
    assert rig.verdict().role == ROLE
