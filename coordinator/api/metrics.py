"""Prometheus metrics of the HTTP service (``GET /metrics`` of ``haco serve``).

:class:`ApiMetrics` keeps its metrics on a :class:`~prometheus_client.CollectorRegistry`
of its own (never the process-wide default), so several apps and tests never collide.
The API calls :meth:`ApiMetrics.observe` with every :class:`InvocationResult` and
:meth:`ApiMetrics.observe_error` with every :class:`HedgeError`; what lives in shared
state — the hedge delay of each role and the hedge budget — is read at scrape time.

Metric names (``role`` is the agent role, ``state`` the group's verdict; a
:class:`HedgeError` other than all-failed / deadline counts as ``not_idempotent``,
``winner_conflict`` or ``failed``):

====================================== ========= ===========================================
``haco_invocations_total``             counter   role, state
``haco_hedged_invocations_total``      counter   role: more than one member launched
``haco_backups_total``                 counter   role: members launched by the hedge timer
``haco_backup_wins_total``             counter   role: backups launched, winner ranked > 0
``haco_all_failed_total``              counter   role: every launched member failed
``haco_hedge_set_size``                histogram role: members launched
``haco_invocation_latency_seconds``    histogram role: the result's end-to-end latency
``haco_member_latency_seconds``        histogram candidate, zone, status: each reported member
``haco_tokens_total``                  counter   role: tokens of every member of a result
``haco_loser_tokens_total``            counter   role: tokens of members that did not win
``haco_hedge_delay_seconds``           gauge     role: current hedge delay (scrape time)
``haco_budget_exhausted_total``        counter   refused backup spends (scrape time)
``haco_budget_spent_backups_total``    counter   backups paid for (scrape time)
``haco_budget_request_tokens``         gauge     backups that may be launched now
``haco_budget_llm_tokens``             gauge     LLM tokens backups may still spend now
``haco_metrics_read_errors_total``     counter   source: a scrape-time read that failed
====================================== ========= ===========================================

Rates are PromQL: hedge rate ``rate(haco_hedged_invocations_total[5m]) /
rate(haco_invocations_total[5m])``, backup win rate the same with
``haco_backup_wins_total``; all-failed rate with ``haco_all_failed_total``. The budget
counters are the fleet's (the Redis hash ``keys.BUDGET``) and restart from zero when that
key expires (a counter reset).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    exposition,
    generate_latest,
)
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from coordinator.config import HacoSettings
from coordinator.errors import (
    AllFailedError,
    DeadlineError,
    HacoError,
    HedgeError,
    NotIdempotentError,
    WinnerConflictError,
)
from coordinator.runtime.results import InvocationResult, MemberSummary
from schemas.enums import GroupState

if TYPE_CHECKING:
    from coordinator.runtime.ports import DelayWindow, HedgeBudget

log = logging.getLogger(__name__)

# The ``state`` label of a HedgeError, most specific class first.
ERROR_STATES: tuple[tuple[type[HedgeError], str], ...] = (
    (AllFailedError, GroupState.ALL_FAILED.value),
    (DeadlineError, GroupState.DEADLINE.value),
    (NotIdempotentError, "not_idempotent"),
    (WinnerConflictError, "winner_conflict"),
)
FINAL_STATES = tuple(s.value for s in GroupState if s.final)
# The text format generate_latest writes is 0.0.4, the type prometheus-client's own
# server answers by default (recent releases set CONTENT_TYPE_LATEST to 1.0.0).
CONTENT_TYPE = str(getattr(exposition, "CONTENT_TYPE_PLAIN_0_0_4", CONTENT_TYPE_LATEST))
READ_SOURCES = ("delay", "budget")  # what the scrape reads (haco_metrics_read_errors_total)


def error_state(error: HedgeError) -> str:
    """The ``state`` label an invocation that raised ``error`` is counted under."""
    for cls, state in ERROR_STATES:
        if isinstance(error, cls):
            return state
    return "failed"


def backup_won(result: InvocationResult) -> bool:
    """Whether a backup won: the group launched backups and its winner is not rank 0
    (the rule of the fleet counter ``backup_wins``, coordinator/runtime/group.py)."""
    if not result.backups or result.winner_id is None:
        return False
    return any(m.member_id == result.winner_id and m.rank > 0 for m in result.members)


class ApiMetrics:
    """The service's metrics on a registry of its own; see the module docstring."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        delays: DelayWindow | None = None,
        budget: HedgeBudget | None = None,
        roles: Iterable[str] = (),
        settings: HacoSettings | None = None,
    ) -> None:
        s = settings or HacoSettings()
        self.registry = registry if registry is not None else CollectorRegistry()
        self.roles = tuple(roles)
        reg = self.registry
        self._invocations = Counter(
            "haco_invocations", "Invocations by role and verdict", ["role", "state"], registry=reg
        )
        self._hedged = _by_role("haco_hedged_invocations", "Invocations with > 1 member", reg)
        self._backups = _by_role("haco_backups", "Backups launched by the hedge timer", reg)
        self._backup_wins = _by_role("haco_backup_wins", "Invocations won by a backup", reg)
        self._all_failed = _by_role("haco_all_failed", "Invocations all members failed", reg)
        self._tokens = _by_role("haco_tokens", "Tokens of every member of a result", reg)
        self._loser_tokens = _by_role("haco_loser_tokens", "Tokens of members that lost", reg)
        self._hedge_size = Histogram(
            "haco_hedge_set_size",
            "Members launched per invocation",
            ["role"],
            buckets=[float(b) for b in s.metrics_hedge_size_buckets],
            registry=reg,
        )
        self._latency = Histogram(
            "haco_invocation_latency_seconds",
            "End-to-end latency of invocations with a result",
            ["role"],
            buckets=list(s.metrics_latency_buckets_s),
            registry=reg,
        )
        self._member_latency = Histogram(
            "haco_member_latency_seconds",
            "Latency of each reported member",
            ["candidate", "zone", "status"],
            buckets=list(s.metrics_latency_buckets_s),
            registry=reg,
        )
        self._zero_series()
        reg.register(_SharedStateCollector(self, delays, budget))

    def _zero_series(self) -> None:
        """The known roles' series exist from the start (at 0), so rates are defined."""
        for role in self.roles:
            for state in FINAL_STATES:
                self._invocations.labels(role, state)
            for counter in (self._hedged, self._backups, self._backup_wins, self._all_failed):
                counter.labels(role)
            self._tokens.labels(role)
            self._loser_tokens.labels(role)

    def observe(self, result: InvocationResult) -> None:
        """Count one invocation that returned a result."""
        role = result.role
        launched = sum(1 for m in result.members if m.launched)
        self._invocations.labels(role, result.state.value).inc()
        self._launched(role, launched)
        if result.backups:
            self._backups.labels(role).inc(result.backups)
        if backup_won(result):
            self._backup_wins.labels(role).inc()
        if result.state is GroupState.ALL_FAILED:
            self._all_failed.labels(role).inc()
        self._latency.labels(role).observe(result.latency_s)
        self._tokens.labels(role).inc(result.tokens)
        for m in result.members:
            self._member(role, m, result.winner_id)

    def observe_error(self, role: str, error: HedgeError) -> None:
        """Count one invocation that raised ``error``. All-failed and deadline errors name
        every launched member (``failures``): their number is the hedge-set size."""
        self._invocations.labels(role, error_state(error)).inc()
        if isinstance(error, AllFailedError | DeadlineError):
            self._launched(role, len(error.failures))
        if isinstance(error, AllFailedError):
            self._all_failed.labels(role).inc()

    def _launched(self, role: str, launched: int) -> None:
        self._hedge_size.labels(role).observe(launched)
        if launched > 1:
            self._hedged.labels(role).inc()

    def _member(self, role: str, m: MemberSummary, winner_id: str | None) -> None:
        if m.latency_s is not None:
            self._member_latency.labels(m.candidate_id, m.zone, m.status.value).observe(m.latency_s)
        if m.member_id != winner_id:
            self._loser_tokens.labels(role).inc(m.tokens_in + m.tokens_out)

    def render(self) -> tuple[bytes, str]:
        """The text exposition of every metric, and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE


class _SharedStateCollector:
    """The metrics read from shared state when Prometheus scrapes: the hedge delay of
    each known role, the hedge budget. A failed read leaves its samples out of this scrape
    and counts in ``haco_metrics_read_errors_total``; the rest of the scrape goes on."""

    def __init__(
        self, owner: ApiMetrics, delays: DelayWindow | None, budget: HedgeBudget | None
    ) -> None:
        self._roles = owner.roles
        self._delays = delays
        self._budget = budget
        self._lock = threading.Lock()
        self._read_errors = dict.fromkeys(READ_SOURCES, 0)

    def describe(self) -> Iterator[Metric]:
        yield _delay_family()
        yield from _budget_families()
        yield _read_errors_family()

    def collect(self) -> Iterator[Metric]:
        yield from self._delay()
        yield from self._budget_values()
        family = _read_errors_family()
        with self._lock:
            for source, count in self._read_errors.items():
                family.add_metric([source], count)
        yield family

    def _read_error(self, source: str) -> None:
        with self._lock:
            self._read_errors[source] += 1

    def _delay(self) -> Iterator[Metric]:
        if self._delays is None:
            return
        family = _delay_family()
        for role in self._roles:
            try:
                family.add_metric([role], self._delays.delay_s(role))
            except HacoError as exc:
                log.warning("metrics: hedge delay of role %s unreadable: %s", role, exc)
                self._read_error("delay")
        yield family

    def _budget_values(self) -> Iterator[Metric]:
        if self._budget is None:
            return
        try:
            snap = self._budget.snapshot()
        except HacoError as exc:
            log.warning("metrics: hedge budget unreadable: %s", exc)
            self._read_error("budget")
            return
        exhausted, spent, req, llm = _budget_families()
        exhausted.add_metric([], snap.exhausted)
        spent.add_metric([], snap.spent_backups)
        req.add_metric([], snap.request_tokens)
        llm.add_metric([], snap.llm_tokens)
        yield from (exhausted, spent, req, llm)


def _delay_family() -> GaugeMetricFamily:
    return GaugeMetricFamily(
        "haco_hedge_delay_seconds", "Current hedge delay of the role", labels=["role"]
    )


def _read_errors_family() -> CounterMetricFamily:
    return CounterMetricFamily(
        "haco_metrics_read_errors",
        "Scrape-time reads of shared state that failed",
        labels=["source"],
    )


def _budget_families() -> tuple[
    CounterMetricFamily, CounterMetricFamily, GaugeMetricFamily, GaugeMetricFamily
]:
    return (
        CounterMetricFamily("haco_budget_exhausted", "Backup spends the hedge budget refused"),
        CounterMetricFamily("haco_budget_spent_backups", "Backups the hedge budget paid for"),
        GaugeMetricFamily("haco_budget_request_tokens", "Backups that may be launched now"),
        GaugeMetricFamily("haco_budget_llm_tokens", "LLM tokens backups may still spend now"),
    )


def _by_role(name: str, documentation: str, registry: CollectorRegistry) -> Counter:
    return Counter(name, documentation, ["role"], registry=registry)


def metrics_response(metrics: ApiMetrics) -> Response:
    """``GET /metrics`` as a Starlette (and so FastAPI) response. It may read Redis (hedge
    delays, budget): serve it from a sync route, which runs in the threadpool."""
    body, content_type = metrics.render()
    return Response(content=body, media_type=content_type)


def metrics_route(metrics: ApiMetrics, path: str = "/metrics") -> Route:
    """A Starlette route serving :func:`metrics_response` (a sync endpoint: Starlette runs
    it in its threadpool); ``app.router.routes.append(metrics_route(m))`` mounts it."""

    def endpoint(_request: Request) -> Response:
        return metrics_response(metrics)

    return Route(path, endpoint, methods=["GET"], include_in_schema=False)
