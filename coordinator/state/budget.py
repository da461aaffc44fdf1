"""The fleet-wide hedge budget: two token buckets shared by every coordinator process.

**Request bucket.** Every invocation the coordinator admits calls :meth:`HedgeBudget.earn`,
which adds ``budget_ratio`` request-tokens (capped at ``budget_burst``); each backup costs
one. With ratio 0.05, at most about 5% of invocations can spawn a backup in the long run,
plus a burst of ``budget_burst``.

**LLM-token bucket.** Backups also cost model tokens: the bucket refills continuously at
``budget_tokens_per_s`` per second of clock time up to ``budget_tokens_burst``, and a
backup set costs the caller's estimate of the tokens it will spend (prompt plus expected
output).

:meth:`HedgeBudget.try_spend` checks BOTH buckets atomically and debits both, or neither:
a refused spend changes no balance and increments the exhaustion counter. When it refuses,
the caller ignores its hedge timer and waits on the members already running (spec
"Hedge budget": this breaks the loop slow responses → backups → load → slow responses).

**Interaction with HACO** (spec ``hedging.md``). The members HACO needs to reach
the reliability target τ under ``parallel`` launch are the reliability floor, not
backups: they are launched without asking the budget and are never charged. The budget
governs only

* extra members launched for tail latency beyond that floor, and
* members launched early under ``staggered`` launch (every member after the first, when
  the hedge delay expires or an earlier member fails).

So with an empty budget HACO still meets τ; only tail-latency hedging stops. The
interplay is explicit in settings (``budget_*`` in :class:`~coordinator.config.HacoSettings`)
and visible to operators through :meth:`HedgeBudget.snapshot` (balances, exhaustion count,
backups spent).

**Shared state.** :class:`RedisBudget` keeps both buckets in the hash :data:`keys.BUDGET`
(fields ``req``, ``llm``, ``ts`` = last LLM refill time, ``exhausted``, ``spent``), one Lua
script per write so every process sees one atomic bucket; the key's expiry
(``budget_ttl_s``) is refreshed on every write, and a missing key means both buckets are
full. The clock value travels in ARGV, so tests inject it; in production every process
passes wall-clock ``time.time()`` (clock skew between hosts only shifts LLM refill, and
the refill time never moves backwards). :class:`MemoryBudget` has the same semantics
under a lock, for single-process runs and tests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from coordinator.config import HacoSettings
from coordinator.errors import StoreError
from coordinator.state import keys
from coordinator.state.checks import check_amount, check_count
from coordinator.state.lua import lua

Clock = Callable[[], float]

# Balances are floats built from repeated additions (20 × 0.05 is not exactly 1.0), so a
# spend is allowed when the balance falls short of the cost by less than this.
EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class BudgetSnapshot:
    request_tokens: float  # backups that may be launched now
    llm_tokens: float  # LLM tokens backups may still spend now
    exhausted: int  # refused spends since the budget state was created
    spent_backups: int  # backups paid for since the budget state was created


def refill(llm: float, ts: float, now: float, settings: HacoSettings) -> tuple[float, float]:
    """The LLM bucket at ``now``: ``(tokens, refill time)``. Never moves time backwards."""
    if now > ts:
        llm += (now - ts) * settings.budget_tokens_per_s
        ts = now
    return min(llm, settings.budget_tokens_burst), ts


# ---------------------------------------------------------------- Redis


def _script(body: str, ret: str = "") -> str:
    """A budget script: the shared prelude, its body, the shared save, a return."""
    return lua("budget_prelude") + lua(body) + lua("budget_save") + ret


def earn_script() -> str:
    """The text of the budget's earn script."""
    return _script("budget_earn")


def spend_script() -> str:
    """The text of the budget's spend script."""
    return _script("budget_spend", "return ok\n")


class RedisBudget:
    """The hedge budget in the Redis hash :data:`keys.BUDGET`, shared by all processes."""

    def __init__(
        self, client: redis.Redis, settings: HacoSettings, clock: Clock = time.time
    ) -> None:
        self._client = client
        self._settings = settings
        self._clock = clock
        self._earn = client.register_script(earn_script())
        self._spend = client.register_script(spend_script())

    def _args(self) -> list[str]:
        s = self._settings
        ttl_ms = max(1, round(s.budget_ttl_s * 1000))
        return [
            repr(float(self._clock())),
            repr(s.budget_burst),
            repr(s.budget_tokens_burst),
            repr(s.budget_tokens_per_s),
            str(ttl_ms),
        ]

    def earn(self, n_requests: int = 1) -> None:
        n = check_count("n_requests", n_requests)
        amount = n * self._settings.budget_ratio
        try:
            self._earn(keys=[keys.BUDGET], args=[*self._args(), repr(amount)])
        except redis.RedisError as exc:
            raise StoreError(f"hedge budget: earn on {keys.BUDGET} failed: {exc}") from exc

    def plan_credit(self) -> tuple[float, int]:
        """One invocation's credit and the hash's TTL (ms), for the coordinator's planning
        read to add in its own round trip (plan_read.lua: the ``pend`` field, folded in by
        the next script)."""
        s = self._settings
        return s.budget_ratio, max(1, round(s.budget_ttl_s * 1000))

    def try_spend(self, backups: int, llm_tokens: float) -> bool:
        n = check_count("backups", backups)
        cost = check_amount("llm_tokens", llm_tokens)
        args = [*self._args(), str(n), repr(cost), repr(EPSILON)]
        try:
            paid = self._spend(keys=[keys.BUDGET], args=args)
        except redis.RedisError as exc:
            raise StoreError(f"hedge budget: spend on {keys.BUDGET} failed: {exc}") from exc
        return int(paid) == 1

    def snapshot(self) -> BudgetSnapshot:
        s = self._settings
        now = float(self._clock())
        try:
            names = ["req", "llm", "ts", "exhausted", "spent", "pend"]
            raw = self._client.hmget(keys.BUDGET, names)
        except redis.RedisError as exc:
            raise StoreError(f"hedge budget: read of {keys.BUDGET} failed: {exc}") from exc
        req, llm, ts, exhausted, spent, pend = raw
        try:
            llm_now, _ = refill(
                s.budget_tokens_burst if llm is None else float(llm),
                now if ts is None else float(ts),
                now,
                s,
            )
            return BudgetSnapshot(
                request_tokens=min(
                    (s.budget_burst if req is None else float(req))
                    + (0.0 if pend is None else float(pend)),
                    s.budget_burst,
                ),
                llm_tokens=llm_now,
                exhausted=0 if exhausted is None else int(exhausted),
                spent_backups=0 if spent is None else int(spent),
            )
        except ValueError as exc:
            raise StoreError(f"hedge budget: {keys.BUDGET} holds bad data {raw!r}") from exc


# ---------------------------------------------------------------- memory


class MemoryBudget:
    """The hedge budget in this process only (tests, single-process runs). No expiry."""

    def __init__(self, settings: HacoSettings, clock: Clock = time.time) -> None:
        self._settings = settings
        self._clock = clock
        self._lock = threading.Lock()
        self._req = settings.budget_burst
        self._llm = settings.budget_tokens_burst
        self._ts: float | None = None  # None = never touched: LLM bucket full
        self._exhausted = 0
        self._spent = 0

    def _refill(self) -> None:
        now = float(self._clock())
        ts = now if self._ts is None else self._ts
        self._llm, self._ts = refill(self._llm, ts, now, self._settings)
        self._req = min(self._req, self._settings.budget_burst)

    def plan_credit(self) -> None:
        """None: a coordinator earns in memory (:meth:`earn`), no planning read credits."""
        return None

    def earn(self, n_requests: int = 1) -> None:
        n = check_count("n_requests", n_requests)
        with self._lock:
            self._refill()
            gained = self._req + n * self._settings.budget_ratio
            self._req = min(self._settings.budget_burst, gained)

    def try_spend(self, backups: int, llm_tokens: float) -> bool:
        n = check_count("backups", backups)
        cost = check_amount("llm_tokens", llm_tokens)
        with self._lock:
            self._refill()
            if self._req + EPSILON >= n and self._llm + EPSILON >= cost:
                self._req = max(0.0, self._req - n)
                self._llm = max(0.0, self._llm - cost)
                self._spent += n
                return True
            self._exhausted += 1
            return False

    def snapshot(self) -> BudgetSnapshot:
        with self._lock:
            now = float(self._clock())
            ts = now if self._ts is None else self._ts
            llm, _ = refill(self._llm, ts, now, self._settings)
            return BudgetSnapshot(
                request_tokens=min(self._req, self._settings.budget_burst),
                llm_tokens=llm,
                exhausted=self._exhausted,
                spent_backups=self._spent,
            )
