"""Prometheus metrics of the HTTP service (coordinator/api/metrics.py): real invocations
through the in-process runtime are observed, the text exposition is parsed back and its
values checked; the scrape-time gauges read a real Redis (hedge delay, budget)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from runtime_helpers import (
    RETURNED,
    ROLE,
    Runtime,
    ScriptedBackend,
    Step,
    build_runtime,
    small_pool,
)
from starlette.applications import Starlette
from starlette.testclient import TestClient

from coordinator.api.metrics import ApiMetrics, metrics_response, metrics_route
from coordinator.config import HacoSettings
from coordinator.core.percentiles import nearest_rank
from coordinator.errors import AllFailedError, DeadlineError, NotIdempotentError
from coordinator.runtime.results import InvocationResult
from coordinator.state import keys
from coordinator.state.budget import RedisBudget
from coordinator.state.hedgedelay import RedisDelayWindow
from schemas.enums import GroupState, LaunchMode, MemberStatus, WinnerMode
from schemas.models import MemberTask
from workers.backends.base import BackendResult, StopCheck

TOKENS_IN, TOKENS_OUT = 11, 7  # what every scripted member spends, success or failure
MakeRuntime = Callable[..., Runtime]
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class SpendingBackend(ScriptedBackend):
    """The scripted backend, with tokens on every outcome (so losers' tokens show)."""

    def call(self, task: MemberTask, should_stop: StopCheck) -> BackendResult:
        res = super().call(task, should_stop)
        return dataclasses.replace(res, tokens_in=TOKENS_IN, tokens_out=TOKENS_OUT)


@pytest.fixture
def make_runtime() -> Iterator[MakeRuntime]:
    made: list[Runtime] = []

    def make(*steps: Step, **overrides: Any) -> Runtime:
        backend = SpendingBackend({f"c{i}": s for i, s in enumerate(steps)})
        made.append(build_runtime(backend, small_pool(len(steps)), **overrides))
        return made[-1]

    yield make
    for rt in made:
        rt.dispatcher.close()


def scrape(metrics: ApiMetrics) -> Samples:
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def backup_win(make_runtime: MakeRuntime) -> tuple[Runtime, InvocationResult]:
    """Staggered: rank 0 hangs until the result is back, the backup launched by the hedge
    timer wins (the budget pays for one backup)."""
    hang = Step(0.005, after=(RETURNED,))
    rt = make_runtime(hang, Step(0.005), Step(0.005), initial_hedge_delay_s=0.05)
    result = rt.invoke(launch_mode=LaunchMode.STAGGERED, winner_mode=WinnerMode.FIRST)
    assert (result.candidate_id, result.backups) == ("c1", 1)
    return rt, result


def ranked_over_a_failure(make_runtime: MakeRuntime) -> InvocationResult:
    """Parallel, ranked: rank 0 fails once rank 1 has finished; rank 1 wins only after rank
    0's report, so the losing rank 0 (and its tokens) is in the result."""
    rt = make_runtime(Step(0.005, ok=False, after=(("finish", "c1"),)), Step(0.005))
    result = rt.invoke()
    assert result.candidate_id == "c1" and result.backups == 0
    assert result.members[0].status is MemberStatus.FAILED
    return result


def all_failed(make_runtime: MakeRuntime) -> AllFailedError:
    rt = make_runtime(*(Step(0.005, ok=False) for _ in range(3)))
    with pytest.raises(AllFailedError) as info:
        rt.invoke()
    return info.value


def test_invocations_backups_and_failures_are_counted(make_runtime: MakeRuntime) -> None:
    rt, won_by_backup = backup_win(make_runtime)
    won_ranked = ranked_over_a_failure(make_runtime)
    failed = all_failed(make_runtime)
    metrics = ApiMetrics(budget=rt.budget, roles=[ROLE])
    metrics.observe(won_by_backup)
    metrics.observe(won_ranked)
    metrics.observe_error(ROLE, failed)
    got = scrape(metrics)

    role = {"role": ROLE}
    assert value(got, "haco_invocations_total", role=ROLE, state="won") == 2
    assert value(got, "haco_invocations_total", role=ROLE, state="all_failed") == 1
    assert value(got, "haco_invocations_total", role=ROLE, state="deadline") == 0
    assert value(got, "haco_hedged_invocations_total", **role) == 3  # 2, 2 and 3 launched
    assert value(got, "haco_backups_total", **role) == 1
    assert value(got, "haco_backup_wins_total", **role) == 1
    assert value(got, "haco_all_failed_total", **role) == 1
    assert value(got, "haco_hedge_set_size_count", **role) == 3
    assert value(got, "haco_hedge_set_size_sum", **role) == 2 + 2 + 3
    assert value(got, "haco_hedge_set_size_bucket", role=ROLE, le="1.0") == 0
    assert value(got, "haco_hedge_set_size_bucket", role=ROLE, le="2.0") == 2
    assert value(got, "haco_invocation_latency_seconds_count", **role) == 2

    # Members that reported: the backup-won group's c1, the ranked group's c0 and c1 (the
    # hung rank 0 was still running at its group's verdict: no latency, no tokens yet).
    assert [m.status for m in won_by_backup.members] == [
        MemberStatus.RUNNING,
        MemberStatus.SUCCEEDED,
        MemberStatus.QUEUED,
    ]
    c1 = {"candidate": "c1", "zone": "local", "status": "succeeded"}
    c0 = {"candidate": "c0", "zone": "local", "status": "failed"}
    assert value(got, "haco_member_latency_seconds_count", **c1) == 2
    assert value(got, "haco_member_latency_seconds_count", **c0) == 1
    c1_latency = sum(r.members[1].latency_s or 0.0 for r in (won_by_backup, won_ranked))
    assert value(got, "haco_member_latency_seconds_sum", **c1) == pytest.approx(c1_latency)

    spent = TOKENS_IN + TOKENS_OUT
    assert value(got, "haco_tokens_total", **role) == 3 * spent
    assert value(got, "haco_loser_tokens_total", **role) == spent  # the ranked group's c0

    # The budget, read at scrape time: the one backup was paid for, nothing refused.
    assert value(got, "haco_budget_spent_backups_total") == 1
    assert value(got, "haco_budget_exhausted_total") == 0
    assert value(got, "haco_budget_request_tokens") == rt.budget.snapshot().request_tokens


def test_hedge_errors_are_labelled_by_kind() -> None:
    metrics = ApiMetrics(roles=[ROLE])
    metrics.observe_error(ROLE, DeadlineError("g1", 2.0, {}))
    metrics.observe_error(ROLE, DeadlineError("g2", 2.0, {"g2.0": "slow", "g2.1": "slower"}))
    metrics.observe_error("planner", NotIdempotentError("hedging demanded", "g3"))
    got = scrape(metrics)
    assert value(got, "haco_invocations_total", role=ROLE, state="deadline") == 2
    assert value(got, "haco_invocations_total", role="planner", state="not_idempotent") == 1
    assert value(got, "haco_hedge_set_size_count", role=ROLE) == 2
    assert value(got, "haco_hedged_invocations_total", role=ROLE) == 1
    assert value(got, "haco_all_failed_total", role=ROLE) == 0
    assert value(got, "haco_hedge_set_size_count", role="planner") is None


def test_hedge_delay_gauge_follows_the_window(redis_db: redis.Redis) -> None:
    settings = HacoSettings(
        hedge_delay_min_samples=4, hedge_delay_percentile=75.0, initial_hedge_delay_s=2.5
    )
    delays = RedisDelayWindow(redis_db, settings)
    metrics = ApiMetrics(delays=delays, roles=[ROLE, "planner"], settings=settings)
    got = scrape(metrics)
    assert value(got, "haco_hedge_delay_seconds", role=ROLE) == 2.5  # window too short
    assert value(got, "haco_hedge_delay_seconds", role="planner") == 2.5

    window = [0.4, 0.1, 0.9, 0.3, 0.2]
    for latency in window:
        delays.record(ROLE, latency)
    got = scrape(metrics)
    expected = nearest_rank(window, 75.0)
    assert expected == 0.4
    assert value(got, "haco_hedge_delay_seconds", role=ROLE) == expected
    assert value(got, "haco_hedge_delay_seconds", role="planner") == 2.5
    assert value(got, "haco_metrics_read_errors_total", source="delay") == 0


def test_an_unreadable_source_drops_its_samples_not_the_scrape(redis_db: redis.Redis) -> None:
    settings = HacoSettings()
    redis_db.set(keys.hedge_delay_ranked(ROLE), b"soon")  # not the sorted set it reads
    redis_db.hset(keys.BUDGET, "exhausted", b"many")
    metrics = ApiMetrics(
        delays=RedisDelayWindow(redis_db, settings),
        budget=RedisBudget(redis_db, settings, clock=lambda: 1000.0),
        roles=[ROLE, "planner"],
        settings=settings,
    )
    got = scrape(metrics)
    assert value(got, "haco_hedge_delay_seconds", role=ROLE) is None
    assert value(got, "haco_hedge_delay_seconds", role="planner") == settings.initial_hedge_delay_s
    assert value(got, "haco_budget_exhausted_total") is None
    assert value(got, "haco_metrics_read_errors_total", source="delay") == 1
    assert value(got, "haco_metrics_read_errors_total", source="budget") == 1
    assert value(got, "haco_invocations_total", role=ROLE, state="won") == 0


def test_budget_exhaustion_is_read_from_the_shared_budget(redis_db: redis.Redis) -> None:
    settings = HacoSettings(budget_burst=1.0, budget_ratio=0.0)
    budget = RedisBudget(redis_db, settings, clock=lambda: 1000.0)
    assert budget.try_spend(1, 10.0)
    assert not budget.try_spend(1, 10.0)
    assert not budget.try_spend(1, 10.0)
    got = scrape(ApiMetrics(budget=budget, settings=settings))
    assert value(got, "haco_budget_exhausted_total") == 2
    assert value(got, "haco_budget_spent_backups_total") == 1
    assert value(got, "haco_budget_request_tokens") == 0
    assert value(got, "haco_budget_llm_tokens") == settings.budget_tokens_burst - 10.0


def test_each_instance_has_its_own_registry() -> None:
    first, second = ApiMetrics(roles=[ROLE]), ApiMetrics(roles=[ROLE])
    first.observe_error(ROLE, AllFailedError("g", {"g.0": "boom"}))
    assert value(scrape(first), "haco_all_failed_total", role=ROLE) == 1
    assert value(scrape(second), "haco_all_failed_total", role=ROLE) == 0
    assert REGISTRY.get_sample_value("haco_all_failed_total", {"role": ROLE}) is None


def test_metrics_are_served_over_http() -> None:
    metrics = ApiMetrics(roles=[ROLE])
    metrics.observe_error(ROLE, AllFailedError("g", {"g.0": "boom", "g.1": "bang"}))
    response = metrics_response(metrics)
    assert response.media_type is not None and response.media_type.startswith("text/plain")
    with TestClient(Starlette(routes=[metrics_route(metrics)])) as http:
        answer = http.get("/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    families = {f.name for f in text_string_to_metric_families(answer.text)}
    assert {"haco_invocations", "haco_hedge_set_size", "haco_loser_tokens"} <= families
    assert GroupState.ALL_FAILED.value in answer.text
