"""Tail cut of bench/runtime.py: a 5 ms median / 200 ms p99 backend, no hedging vs
always-two vs staggered-with-budget, against offline oracles; and bare Celery running the
same draws (a task that sleeps them), whose round trip less its task's own time is the
runtime cost of a plain Celery call on this machine in the same conditions.

The variants run interleaved, in chunks, so that a change of load on the machine hits
them alike. The hedge budget is one fleet-wide bucket in Redis: each variant's bucket is
saved after its chunk and restored before its next one, so none draws on another's.
"""

from __future__ import annotations

import json
import math
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.bare_celery import create_bare_app, send_sleep
from bench.hotpath_goals import TAIL_BARE, TAIL_VARIANT
from bench.rtbench import CALL_DEADLINE_S, HEDGED, wait_ready
from bench.rtlib import Services, own_latency, read_traces, summary_ms, timed_client
from bench.tailideal import p99, p99_interval, pair, policy_split, ratio_interval, staggered
from coordinator.config import HacoSettings
from coordinator.core.percentiles import interpolated
from coordinator.state import keys
from coordinator.state.budget import RedisBudget

MEDIAN_S, SIGMA = 0.005, math.log(200 / 5) / 2.326
CHUNK = 100  # invocations of one variant before the next variant's turn
WARMUP = 300  # unmeasured calls that fill the role's delay window
# Calls of the goal's variant: the p99 of 1 500 calls of an ideal p95-delay launch
# spreads ±8% (5th to 95th percentile of repeated samples), wider than the goal's 5%
# margin; 6 000 calls bring it to ±3.5%.
GOAL_N = 6000
STAGGERED = {**HEDGED, "launch_mode": "staggered"}
VARIANTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # name: (per-call options, client settings)
    "none": ({"idempotent": False, "winner_mode": "first"}, {}),
    "always-two": ({**HEDGED, "launch_mode": "parallel"}, {}),
    TAIL_VARIANT: (STAGGERED, {"hedge_delay_percentile": 95.0, "budget_ratio": 0.05}),
    "staggered-p90-b5": (STAGGERED, {"hedge_delay_percentile": 90.0, "budget_ratio": 0.05}),
    "staggered-p90-b10": (STAGGERED, {"hedge_delay_percentile": 90.0, "budget_ratio": 0.10}),
}


def run_parallel(n: int, inflight: int, fn: Callable[[int], None]) -> None:
    """fn(0..n-1) on ``inflight`` threads."""
    lock = threading.Lock()
    nxt = iter(range(n))

    def worker() -> None:
        while True:
            with lock:
                i = next(nxt, None)
            if i is None:
                return
            fn(i)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(inflight)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(CALL_DEADLINE_S * n)


class Variant:
    def __init__(self, svc: Services, opts: dict[str, Any], settings: dict[str, Any]) -> None:
        self.svc = svc
        self.opts = opts
        self.settings = settings
        self.client, self.marks = timed_client(svc.url, **settings)
        self.budget: dict[Any, Any] = {}  # this variant's bucket; empty = full
        self.bucket = RedisBudget(svc.app_redis, HacoSettings(**settings))
        self.refused = 0  # the bucket's refusals, as of this variant's last chunk
        self.lat: list[float] = []
        self.calls: list[tuple[str, float]] = []  # (group id, its hedge delay s)
        self.launched: list[int] = []
        self.backups = 0
        self.lags: list[float] = []
        self.winners: list[str] = []
        self.lock = threading.Lock()

    def one(self, i: int) -> None:
        marks = self.marks
        marks.local.delay = math.nan
        t0 = time.time()
        res = self.client.invoke("tail", "x", deadline_s=CALL_DEADLINE_S, **self.opts)
        t1 = time.time()
        sent = marks.sent[res.group_id]
        with self.lock:
            self.lat.append(t1 - t0)
            self.calls.append((res.group_id, marks.local.delay))
            self.launched.append(sum(m.launched for m in res.members))
            self.backups += res.backups
            self.winners.append(res.winner_id or "")
            if res.backups:  # the timer runs from rank 0's launch: how late did rank 1 go?
                self.lags.append(sent[1][0] - sent[0][0] - marks.local.delay)

    def close(self) -> None:
        self.client.close()

    def chunk(self, n: int, inflight: int) -> None:
        r = self.svc.app_redis
        r.delete(keys.BUDGET)
        if self.budget:
            r.hset(keys.BUDGET, mapping=self.budget)
        run_parallel(n, inflight, self.one)
        self.budget = r.hgetall(keys.BUDGET)
        self.refused = self.bucket.snapshot().exhausted

    def summary(self, traces: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
        own = {m["member_id"]: own_latency(m) for ms in traces.values() for m in ms}
        won = [own[w] for w in self.winners if w in own]
        delays = self.marks.delays
        is_staggered = self.opts.get("launch_mode") == "staggered"
        same = same_draws(self.calls, self.lat, traces, is_staggered)
        unpaid = over_delay_alone(self.calls, self.launched, traces) if is_staggered else None
        # launched beyond one per call, over the calls: (420 − 400) / 400 is 0.05, where
        # 420 / 400 − 1 is 0.05000000000000004, above a 5% goal
        load = (sum(self.launched) - len(self.lat)) / max(1, len(self.lat))
        drawn = {
            m["member_id"]: float(m["proc_latency_s"])
            for ms in traces.values()
            for m in ms
            if m.get("proc_latency_s") is not None
        }
        beyond = [
            lat - drawn[w]
            for lat, w, n in zip(self.lat, self.winners, self.launched, strict=True)
            if n == 1 and w in drawn
        ]
        return {
            **summary_ms(self.lat),
            "p99_ms_ci90": p99_interval(self.lat),
            "same_draws": summary_ms(same),  # no runtime cost: the policy alone
            "runtime_cost": summary_ms([a - b for a, b in zip(self.lat, same, strict=True)]),
            "paired_ideal": paired_ideal(self.calls, self.lat, same, traces, load, unpaid)
            if unpaid is not None
            else None,
            # The budget's refusals (its bucket's count) and the calls whose rank 0 outlasted
            # the delay with no backup: what the policy's share holds beside the delay.
            "refused": None
            if unpaid is None
            else {"budget": self.refused, "over_delay": int(unpaid.sum())},
            # Calls of one member: the round trip less the backend's drawn time (the trace's
            # proc_latency_s), which the member's own latency also holds its start's
            # round trip and its thread's hand-off in, and a sleep's late wake-up.
            "beyond_draw": summary_ms(beyond) if beyond else None,
            "extra_load": load,
            "backups": self.backups,
            "settings": self.settings,
            "winner_backend": summary_ms(won),  # the winning member's own latency
            "delay_ms_p50": interpolated(delays, 50)[0] * 1e3 if delays else None,
            "backup_lag_ms_p50": interpolated(self.lags, 50)[0] * 1e3 if self.lags else None,
            "backup_lag_ms_p99": interpolated(self.lags, 99)[0] * 1e3 if self.lags else None,
        }


class BareVariant:
    """Bare Celery's calls in the tail's conditions: a task sleeping a draw of the same
    backend, one call after another. Between calls that idle the machine for milliseconds
    a round trip costs more than in the back-to-back overhead bench (every process wakes
    from idle): this is that cost for a plain Celery call, beside HACO's ``none``."""

    def __init__(self, svc: Services, seed: int = 1) -> None:
        self.app = create_bare_app(svc.url, svc.concurrency)
        self.r = svc.app_redis
        self.rng = np.random.default_rng(seed)
        self.lat: list[float] = []
        self.own: list[float] = []
        self.drawn: list[float] = []  # each call's draw: the time its task sleeps
        self.lock = threading.Lock()

    def one(self, i: int) -> None:
        with self.lock:  # one generator, drawn in turn
            sleep_s = float(MEDIAN_S * math.exp(SIGMA * self.rng.standard_normal()))
        key = f"bench:bare:tail:{uuid.uuid4().hex}"
        t0 = time.time()
        send_sleep(self.app, key, str(i), sleep_s)
        got = self.r.brpop([key], timeout=CALL_DEADLINE_S)
        t1 = time.time()
        if got is None:
            raise RuntimeError(f"bare worker silent for {CALL_DEADLINE_S} s")
        _, started, finished = json.loads(got[1])
        with self.lock:
            self.lat.append(t1 - t0)
            self.own.append(float(finished) - float(started))
            self.drawn.append(sleep_s)

    def chunk(self, n: int, inflight: int) -> None:
        run_parallel(n, inflight, self.one)

    def close(self) -> None:
        self.app.close()

    def summary(self, traces: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
        return {
            **summary_ms(self.lat),
            "p99_ms_ci90": p99_interval(self.lat),
            "same_draws": summary_ms(self.own),
            "runtime_cost": summary_ms([a - b for a, b in zip(self.lat, self.own, strict=True)]),
            "beyond_draw": summary_ms([a - b for a, b in zip(self.lat, self.drawn, strict=True)]),
            "extra_load": 0.0,
            "backups": 0,
            "settings": {},
            "winner_backend": summary_ms(self.own),
            "delay_ms_p50": None,
            "backup_lag_ms_p50": None,
            "backup_lag_ms_p99": None,
        }


def same_draws(
    calls: list[tuple[str, float]],
    lat: list[float],
    traces: dict[str, list[dict[str, Any]]],
    staggered: bool,
) -> list[float]:
    """Each call's latency had the runtime cost nothing: its members' own latencies (the
    backend's draws), rank 1 launched at exactly the call's hedge delay under a staggered
    launch, at once under a parallel one; a call without a succeeded member's trace keeps
    its measured latency. The p99 of these against the ideal is the policy's share (the
    rolling delay, the budget); the measured p99 against theirs is the runtime's.
    ``calls``: (group id, hedge delay s) per call, ``lat`` its measured latency."""
    out = []
    for (gid, delay), measured in zip(calls, lat, strict=True):
        ends = [
            own_latency(m) + (delay if staggered and m["rank"] > 0 else 0.0)
            for m in traces.get(gid, [])
            if m["status"] == "succeeded"
        ]
        out.append(min(ends) if ends else measured)
    return out


def over_delay_alone(
    calls: list[tuple[str, float]], launched: list[int], traces: dict[str, list[dict[str, Any]]]
) -> np.ndarray:
    """Per call: one member launched, yet rank 0 ran past the call's hedge delay (its own
    time; its start lags the timer's, so this undercounts): a backup the budget refused."""
    out = []
    for (gid, delay), n in zip(calls, launched, strict=True):
        own = [own_latency(m) for m in traces.get(gid, []) if m["rank"] == 0]
        out.append(n == 1 and bool(own) and own[0] > delay)
    return np.asarray(out, dtype=bool)


def paired_ideal(
    calls: list[tuple[str, float]],
    lat: list[float],
    same: list[float],
    traces: dict[str, list[dict[str, Any]]],
    extra_load: float,
    unpaid: np.ndarray,
    seed: int = 1,
) -> dict[str, Any] | None:
    """Beside the goal: the run's p99 over the ideal launch on its own calls' draws at its
    extra load (bench.tailideal), with its 90% interval, and the same calls with no
    runtime cost (``same``: the policy's share) over it, that share split
    (:func:`policy_split`). A backup the ideal fires that the run never ran draws from the
    tail's backend (``seed``)."""
    rng = np.random.default_rng(seed)

    def fresh(n: int) -> np.ndarray:
        return backend_draws(rng, n)

    got = pair(calls, lat, traces, extra_load, fresh)
    if got is None:
        return None
    ideal = p99(got.ideal_s)
    return {
        "p99_ms": ideal * 1e3,
        "delay_ms": got.delay_s * 1e3,
        "filled": got.filled,
        "unpaired": int((~got.keep).sum()),
        "p99_over": p99(got.lat_s) / ideal,
        "p99_over_ci90": ratio_interval(got.lat_s, got.ideal_s),
        "same_draws_over": p99(np.asarray(same, dtype=float)[got.keep]) / ideal,
        **policy_split(calls, unpaid, got, extra_load, fresh),
    }


def backend_draws(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` draws of the tail's backend (s): lognormal, 5 ms median, 200 ms p99."""
    return np.asarray(MEDIAN_S * np.exp(SIGMA * rng.standard_normal(n)), dtype=float)


def oracle(n: int = 400_000, seed: int = 0) -> dict[str, Any]:
    """Offline, backend only: one draw; min of two draws; ideal staggered at p95/p90."""
    rng = np.random.default_rng(seed)
    x = backend_draws(rng, 2 * n).reshape(n, 2)
    out: dict[str, Any] = {
        "single": {**summary_ms(list(x[:, 0])), "extra_load": 0.0},
        "min_of_two": {**summary_ms(list(x.min(axis=1))), "extra_load": 1.0},
    }
    curve = []
    # Dense between p90 and p99: the tail goal interpolates this curve by extra load at
    # a few percent (bench.hotpath_goals.ideal_at).
    for p in (50, 70, 75, 80, 85, 90, 92, 93, 94, 95, 96, 97, 98, 99):
        d = interpolated(x[:, 0], p)[0]
        stag, fired = staggered(x[:, 0], x[:, 1], d)
        s = {**summary_ms(list(stag)), "delay_ms": d * 1e3, "extra_load": float(fired.mean())}
        if p in (95, 90):
            out[f"ideal_staggered_p{p}"] = s
        curve.append({"percentile": p, **{k: s[k] for k in ("delay_ms", "extra_load", "p99_ms")}})
    return {**out, "curve": curve}


def tail(svc: Services, n: int, inflight: int, goal_n: int = GOAL_N) -> dict[str, Any]:
    svc.start_haco()
    svc.start_bare()
    warm, _ = timed_client(svc.url)

    def fill(i: int) -> None:
        warm.invoke("tail", "w", idempotent=False, deadline_s=CALL_DEADLINE_S)

    try:
        wait_ready(warm, "tail", svc)
        run_parallel(WARMUP, inflight, fill)
    finally:
        warm.close()
    since = int(time.time() * 1000)
    bare = BareVariant(svc)
    try:
        for i in range(20):  # warm: the bare worker up and its first calls made
            bare.one(i)
    except RuntimeError as exc:
        bare.close()
        raise RuntimeError(f"{exc}\n{svc.log_tail('bare')}") from exc
    for warm_calls in (bare.lat, bare.own, bare.drawn):
        warm_calls.clear()
    runs: dict[str, Variant | BareVariant] = {
        name: Variant(svc, opts, settings) for name, (opts, settings) in VARIANTS.items()
    }
    runs[TAIL_BARE] = bare
    rounds = max(1, math.ceil(n / CHUNK))
    sizes = {name: (goal_n if name == TAIL_VARIANT else n) for name in runs}
    try:
        for i in range(rounds):  # each variant's calls spread evenly over the rounds
            for name, v in runs.items():
                size = sizes[name] * (i + 1) // rounds - sizes[name] * i // rounds
                v.chunk(size, inflight)
        time.sleep(1.0)  # losers of the last chunk report
    finally:
        for v in runs.values():
            v.close()
    traces = read_traces(svc.app_redis, since)
    variants = {name: v.summary(traces) for name, v in runs.items()}
    orc = oracle()
    curve = orc.pop("curve")
    p99_oracle = orc["min_of_two"]["p99_ms"]
    for s in variants.values():
        s["p99_over_oracle"] = s["p99_ms"] / p99_oracle
    return {
        "n": n,
        "n_goal_variant": goal_n,
        "inflight": inflight,
        "chunk": CHUNK,
        "variants": variants,
        "offline": orc,
        "offline_staggered_curve": curve,  # ideal staggered: delay percentile → p99, load
    }
