"""Periodic profile recomputation (coordinator.tracestore.recompute,
coordinator.state.epochs): the merge of a snapshot with online deltas, the SQL
aggregation against the pure fold, and the end to end split — nothing counted twice,
nothing dropped — on real Redis and Postgres (a database of this run's own in each,
tests/services.py)."""

from __future__ import annotations

import itertools
import json
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import fields
from datetime import UTC, datetime
from functools import reduce
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st
from polling import wait_for
from psycopg_pool import ConnectionPool
from services import UNREACHABLE_REDIS_URL
from typer.testing import CliRunner

from coordinator.cli import profiles as cli_profiles
from coordinator.cli.main import app
from coordinator.config import HacoSettings
from coordinator.core import domains
from coordinator.core.evidence import link_id
from coordinator.core.observations import (
    CALL_SUCCEEDED,
    NOT_OBSERVED,
    SERVICE_FAILURES,
    observations,
)
from coordinator.core.params import DecayUnit, ProfileSettings
from coordinator.core.profile_merge import merge_candidate, merge_link
from coordinator.core.profiles import (
    CandidateObservation,
    CandidateProfile,
    LinkObservation,
    LinkProfile,
    Moments,
    apply_quality,
    update_candidate,
    update_link,
)
from coordinator.errors import InputError, StoreError
from coordinator.runtime.pool import Pool, default_pool, domain_pools, pool_from_settings
from coordinator.state import epochs, keys
from coordinator.state.memberops import MemberOutcome, OutcomeLimits
from coordinator.state.memstore import MemoryStore
from coordinator.state.store import RedisStore
from coordinator.tracestore.db import connect
from coordinator.tracestore.harvester import Harvester
from coordinator.tracestore.profilesql import aggregate, split_id
from coordinator.tracestore.recompute import RECOMPUTE_LOCK, recompute, wait_harvested
from schemas.enums import FailureKind
from schemas.models import MemberReport, MemberTask, MemberTrace
from workers.app import create_app
from workers.maintenance import (
    MAINTENANCE_QUEUE,
    RECOMPUTE_TASK,
    RETENTION_ENTRY,
    RETENTION_TASK,
    SCHEDULE_ENTRY,
    register_maintenance,
)

INF = ProfileSettings()
# Small windows, so that merging and the SQL trim them.
BY_OBS = ProfileSettings(
    half_life=5.0, decay_unit=DecayUnit.OBSERVATIONS, latency_window=8, bandwidth_window=8
)
BY_TIME = ProfileSettings(
    half_life=30.0, decay_unit=DecayUnit.SECONDS, latency_window=8, bandwidth_window=8
)
LIMITS = OutcomeLimits(profile_ttl_s=600.0, trace_maxlen=1_000_000, trace_ttl_s=600.0)


# ---------------------------------------------------------------- comparing profiles


def assert_same(got: Any, want: Any, path: str = "", rel: float = 1e-9) -> None:
    """Field by field, floats to ``rel`` relative (1e-5 absolute for times)."""
    if isinstance(want, CandidateProfile | LinkProfile | Moments):
        assert type(got) is type(want), path
        for f in fields(want):
            assert_same(getattr(got, f.name), getattr(want, f.name), f"{path}.{f.name}", rel)
    elif isinstance(want, tuple):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{path}[{i}]", rel)
    elif isinstance(want, float) and not isinstance(want, bool):
        assert got == pytest.approx(want, rel=rel, abs=1e-5), path
    else:
        assert got == want, path


# ---------------------------------------------------------------- merge = fold (pure)

kinds = st.sampled_from([None, None, FailureKind.INTERNAL, FailureKind.NETWORK,
                         FailureKind.DEADLINE])  # fmt: skip


@st.composite
def cand_obs(draw: st.DrawFn) -> CandidateObservation:
    kind = draw(kinds)
    ok = kind is None
    return CandidateObservation(
        at_s=0.0,  # set in order by the test
        delivered=kind is not FailureKind.NETWORK or draw(st.booleans()),
        failure=kind,
        quality=draw(st.none() | st.floats(0, 1)) if ok else None,
        proc_latency_s=draw(st.none() | st.floats(0, 30)) if ok else None,
        tokens_in=draw(st.integers(0, 5000)),
        tokens_out=draw(st.integers(0, 5000)),
    )


@st.composite
def link_obs(draw: st.DrawFn) -> LinkObservation:
    lost = draw(st.booleans())
    return LinkObservation(
        0.0, draw(st.floats(1, 1e6)), lost, draw(st.none() | st.floats(1e-4, 5)),
        draw(st.none() | st.floats(0, 1)), lost or draw(st.booleans()),
    )  # fmt: skip


def timed(obs: Sequence[Any], gaps: Sequence[float]) -> list[Any]:
    """Non-decreasing observation times (the fold order = the stream order)."""
    at, out = 1000.0, []
    for o, gap in zip(obs, gaps, strict=False):
        at += gap
        out.append(type(o)(**{**{f.name: getattr(o, f.name) for f in fields(o)}, "at_s": at}))
    return out


def segments(items: list[Any], cuts: list[int]) -> list[list[Any]]:
    bounds = sorted({min(c, len(items)) for c in cuts})
    out, start = [], 0
    for b in [*bounds, len(items)]:
        out.append(items[start:b])
        start = b
    return out


PROFILE_SETTINGS = st.sampled_from([INF, BY_OBS, BY_TIME])


@settings(max_examples=300, deadline=None)
@given(
    obs=st.lists(cand_obs(), max_size=40),
    gaps=st.lists(st.floats(0, 20), min_size=40, max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=4),
    cfg=PROFILE_SETTINGS,
)
def test_merging_deltas_equals_folding_everything_candidates(
    obs: list[CandidateObservation], gaps: list[float], cuts: list[int], cfg: ProfileSettings
) -> None:
    seq = timed(obs, gaps)

    def fold(part: list[CandidateObservation]) -> CandidateProfile:
        return reduce(lambda p, o: update_candidate(p, o, cfg), part, CandidateProfile("c"))

    parts: list[CandidateProfile | None] = [fold(part) for part in segments(seq, cuts)]
    merged = reduce(lambda a, b: merge_candidate(a, b, cfg), parts[1:], parts[0])  # deltas
    assert_same(merged, fold(seq))


@settings(max_examples=200, deadline=None)
@given(
    obs=st.lists(link_obs(), max_size=40),
    gaps=st.lists(st.floats(0, 20), min_size=40, max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=4),
    cfg=PROFILE_SETTINGS,
)
def test_merging_deltas_equals_folding_everything_links(
    obs: list[LinkObservation], gaps: list[float], cuts: list[int], cfg: ProfileSettings
) -> None:
    seq = timed(obs, gaps)

    def fold(part: list[LinkObservation]) -> LinkProfile:
        return reduce(lambda p, o: update_link(p, o, cfg), part, LinkProfile("a", "b"))

    parts: list[LinkProfile | None] = [fold(part) for part in segments(seq, cuts)]
    merged = reduce(lambda a, b: merge_link(a, b, cfg), parts[1:], parts[0])
    assert merged is not None
    assert_same(merged, fold(seq))


def test_a_delta_of_late_judgements_only_adds_evidence() -> None:
    base = update_candidate(
        CandidateProfile("c"), CandidateObservation(5.0, True, proc_latency_s=1.0), INF
    )
    judged = apply_quality(CandidateProfile("c"), 0.8, INF, 5.0)  # a delta with no call
    merged = merge_candidate(base, judged, INF)
    assert merged is not None
    assert_same(merged, apply_quality(base, 0.8, INF, 5.0))
    assert merge_candidate(None, judged, INF) is judged
    assert merge_candidate(base, None, INF) is base


# ---------------------------------------------------------------- fixtures


@pytest.fixture
def conn(db: str) -> Iterator[psycopg.Connection[Any]]:
    with connect(db) as c:
        yield c


def hsettings(**overrides: Any) -> HacoSettings:
    base: dict[str, Any] = {
        "harvest_batch": 500, "harvest_block_ms": 20, "recompute_wait_s": 20.0,
        "profile_ttl_s": 600.0,
    }  # fmt: skip
    return HacoSettings(**{**base, **overrides})


# ---------------------------------------------------------------- traces

ZONES = {"c0": "us", "c1": "eu", "c2": "us", "c3": "ap"}
CALLER = "eu"


def make_trace(i: int, cand: str, rng: random.Random, now: float) -> MemberTrace:
    """A random member outcome of every kind the worker path produces."""
    kind = rng.choice(["ok", "ok", "ok", "internal", "net_req", "net_resp", "deadline",
                       "cancelled", "taken"])  # fmt: skip
    ok = kind in ("ok", "taken")
    fields_: dict[str, Any] = {
        "invocation_id": f"g{i}", "group_id": f"g{i}", "member_id": f"g{i}.0",
        "candidate_id": cand, "role": "coder", "model": "m", "zone": ZONES[cand],
        "caller_zone": CALLER, "rank": 0, "u_plus": 0.5, "r_minus": 0.2,
        "started_at_s": now - 1.0, "finished_at_s": now, "status": "succeeded",
        "success": True, "latency_s": 1.0, "tokens_in": rng.randint(0, 900),
        "tokens_out": rng.randint(0, 900), "bytes_sent": rng.randint(100, 9000),
        "rtt_s": rng.uniform(0.001, 0.2), "bandwidth_Bps": rng.uniform(1e5, 1e7),
    }  # fmt: skip
    if ok:
        fields_["quality"] = rng.choice([None, rng.random()])
        fields_["proc_latency_s"] = rng.choice([None, rng.uniform(0.1, 9)])
    if kind != "ok":
        status = {"deadline": "timed_out", "cancelled": "cancelled", "taken": "cancelled"}
        failure = {"net_req": "network", "net_resp": "network", "taken": "idempotency_taken"}
        fields_.update(status=status.get(kind, "failed"), success=False,
                       failure_kind=failure.get(kind, kind))  # fmt: skip
        fields_["failure_reason"] = {
            "taken": "idempotency key 'k' already taken by g.1",
            "cancelled": "cancelled while running",
        }.get(kind, "boom")
    if kind == "net_req":
        fields_.update(rtt_s=None, bandwidth_Bps=None, lost=True)
    if kind == "net_resp":
        fields_.update(lost=True, proc_latency_s=1.0)
    if kind == "cancelled":
        fields_.update(bytes_sent=0, rtt_s=None, bandwidth_Bps=None, tokens_in=0, tokens_out=0)
    return MemberTrace.model_validate(fields_)


def record(store: RedisStore, trace: MemberTrace, cfg: ProfileSettings = INF) -> None:
    """What workers.member._report_and_harvest does (one script: reply, outcome claim,
    fold, trace), with the trace's own link reading."""
    obs, legs = observations(trace)
    src, dst = trace.caller_zone, trace.zone
    report = MemberReport(trace=trace, output="x" if trace.success else None)
    outcome = MemberOutcome(
        trace.group_id, report.model_dump_json(), 60.0, True, f"outcome:{trace.member_id}",
        "worker", trace.candidate_id, obs, link_id(src, dst), src, dst, legs,
    )  # fmt: skip
    assert store.report_member(outcome, cfg, LIMITS)


def _ts(at_s: float) -> datetime:
    return datetime.fromtimestamp(at_s, UTC)


def drain(h: Harvester) -> None:
    while h.run_once():
        pass


def stream_order(db: str) -> dict[str, tuple[int, int]]:
    with psycopg.connect(db) as c:
        rows = c.execute("SELECT member_id, stream_id FROM members").fetchall()
    return {m: split_id(s) for m, s in rows}


def expected(
    traces: list[MemberTrace], order: dict[str, tuple[int, int]], cfg: ProfileSettings
) -> tuple[dict[str, CandidateProfile], dict[str, LinkProfile]]:
    """Fold every trace's observations in stream order from scratch."""
    cands: dict[str, CandidateProfile] = {}
    links: dict[str, LinkProfile] = {}
    for t in sorted(traces, key=lambda t: order[t.member_id]):
        obs, legs = observations(t)
        if obs is not None:
            prof = cands.get(t.candidate_id) or CandidateProfile(t.candidate_id)
            cands[t.candidate_id] = update_candidate(prof, obs, cfg)
        for lo in legs:
            lid = link_id(t.caller_zone, t.zone)
            link = links.get(lid) or LinkProfile(t.caller_zone, t.zone)
            links[lid] = update_link(link, lo, cfg)
    return cands, links


# ---------------------------------------------------------------- SQL = fold


@pytest.mark.parametrize("cfg", [INF, BY_OBS, BY_TIME], ids=["inf", "observations", "seconds"])
def test_the_sql_aggregation_equals_folding_the_stored_traces(
    r: redis.Redis, pool: ConnectionPool, db: str, conn: Any, cfg: ProfileSettings
) -> None:
    rng = random.Random(7)
    now = time.time()
    store = RedisStore(r, cfg)
    traces = [
        make_trace(i, rng.choice(list(ZONES)), rng, now + i * rng.random()) for i in range(400)
    ]
    for t in traces:
        record(store, t, cfg)
    last = r.xinfo_stream(keys.TRACES)["last-generated-id"].decode()
    drain(Harvester(r, pool, hsettings(), "h"))
    cands, links = aggregate(conn, last, _ts(now - 3600), _ts(now + 10**6), cfg)
    want_c, want_l = expected(traces, stream_order(db), cfg)
    assert sorted(cands) == sorted(want_c) and sorted(links) == sorted(want_l)
    # Postgres keeps finish times to the microsecond: with a half-life in seconds the
    # weights differ from the fold's in the 8th digit.
    rel = 1e-6 if cfg.decay_unit is DecayUnit.SECONDS and not math.isinf(cfg.half_life) else 1e-9
    for c in want_c:
        assert_same(cands[c], want_c[c], c, rel)
    for lk in want_l:
        assert_same(links[lk], want_l[lk], lk, rel)
    # and the online deltas (epoch 0, no snapshot) hold the same profiles
    view = store.load_view(list(ZONES), list(want_l))
    for c in want_c:
        assert_same(view.candidates[c], want_c[c], c)


STATUS = {None: "succeeded", FailureKind.DEADLINE: "timed_out", FailureKind.CANCELLED: "cancelled",
          FailureKind.IDEMPOTENCY_TAKEN: "cancelled"}  # fmt: skip


def every_kind_of_trace(now: float) -> list[MemberTrace]:
    """One trace per failure kind (and success) × request path delay measured or not ×
    lost or not × bytes sent or not, each on its own candidate's link in turn."""
    out = []
    grid = itertools.product([None, *FailureKind], [None, 0.04], [False, True], [0, 1200])
    for i, (kind, rtt, lost, sent) in enumerate(grid):
        cand = list(ZONES)[i % len(ZONES)]
        out.append(MemberTrace(
            invocation_id=f"k{i}", group_id=f"k{i}", member_id=f"k{i}.0", candidate_id=cand,
            role="coder", model="m", zone=ZONES[cand], caller_zone=CALLER, rank=0,
            u_plus=0.5, r_minus=0.2, started_at_s=now + i - 1.0, finished_at_s=now + i,
            status=STATUS.get(kind, "failed"), failure_kind=kind, success=kind is None,
            failure_reason=None if kind is None else "why", quality=0.1 + i / 200,
            latency_s=1.0, proc_latency_s=0.2 + i / 100, tokens_in=i, tokens_out=2 * i,
            bytes_sent=sent, rtt_s=rtt, bandwidth_Bps=8e4 if rtt else None, lost=lost,
        ))  # fmt: skip
    return out


@pytest.mark.parametrize("cfg", [INF, BY_OBS], ids=["inf", "observations"])
def test_the_sql_reads_every_kind_of_trace_as_observations_does(
    r: redis.Redis, pool: ConnectionPool, db: str, conn: Any, cfg: ProfileSettings
) -> None:
    """coordinator.core.observations.observations is the one reading of a trace; the SQL
    (recompute and the link_observations view) must agree with it on every failure kind
    and delivery flag."""
    now = time.time()
    traces = every_kind_of_trace(now)
    store = RedisStore(r, cfg)
    for t in traces:
        record(store, t, cfg)
    last = r.xinfo_stream(keys.TRACES)["last-generated-id"].decode()
    drain(Harvester(r, pool, hsettings(), "h"))
    cands, links = aggregate(conn, last, _ts(now - 3600), _ts(now + 10**6), cfg)
    want_c, want_l = expected(traces, stream_order(db), cfg)
    assert sorted(cands) == sorted(want_c) and sorted(links) == sorted(want_l)
    for c in want_c:
        assert_same(cands[c], want_c[c], c)
    for lk in want_l:
        assert_same(links[lk], want_l[lk], lk)
    # Every kind is in the grid, and each counts where observations says it does.
    read = [observations(t)[0] for t in traces]
    per_kind = len(traces) // (len(FailureKind) + 1)  # every kind and success, alike
    observed = len(traces) - per_kind * len(NOT_OBSERVED)  # not cancelled
    assert sum(p.observations for p in want_c.values()) == observed
    ok = per_kind * (1 + len(CALL_SUCCEEDED))  # ok and taken
    assert sum(1 for o in read if o and o.failure is None) == ok
    if math.isinf(cfg.half_life):  # plain counts: every service failure is one for f_int
        internal = per_kind * len(SERVICE_FAILURES)
        assert sum(p.internal_failures for p in want_c.values()) == internal
    assert sum(1 for o in read if o and not o.delivered) == 4  # network, no rtt measured
    linked = sorted(t.member_id for t in traces if observations(t)[1])
    with psycopg.connect(db) as pg:
        stored = pg.execute("SELECT member_id FROM link_observations ORDER BY 1").fetchall()
    assert [m for (m,) in stored] == linked


# ---------------------------------------------------------------- end to end


def delta_epochs(r: redis.Redis) -> set[int]:
    found = set()
    for name in r.scan_iter(match=f"{keys.DELTA_PREFIX}:*"):
        found.add(int(name.decode().split(":")[3]))
    return found


def counts(profiles: dict[str, CandidateProfile]) -> dict[str, tuple[float, ...]]:
    return {
        c: (p.calls, p.successes, p.internal_failures, p.network_failures,
            p.deadline_failures, p.delivered, float(p.observations))
        for c, p in profiles.items()
    }  # fmt: skip


class Writers:
    """Threads recording random outcomes through RedisStore.record_outcome; the last
    fifth of each writer's outcomes waits for ``gate``."""

    def __init__(self, redis_url: str, n: int, per_writer: int) -> None:
        self.redis_url, self.n, self.per_writer = redis_url, n, per_writer
        self.traces: list[MemberTrace] = []
        self.errors: list[BaseException] = []
        self.lock = threading.Lock()
        self.recorded = threading.Semaphore(0)
        self.gate = threading.Event()
        self.threads = [threading.Thread(target=self.write, args=(w,)) for w in range(n)]

    def write(self, w: int) -> None:
        rng, store = random.Random(w), RedisStore(redis.Redis.from_url(self.redis_url))
        try:
            for k in range(self.per_writer):
                if k == self.per_writer * 4 // 5:
                    assert self.gate.wait(60)
                t = make_trace(w * 10_000 + k, rng.choice(list(ZONES)), rng, time.time())
                record(store, t)
                with self.lock:
                    self.traces.append(t)
                self.recorded.release()
                time.sleep(rng.uniform(0, 0.004))
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            store.r.close()

    def wait_recorded(self, n: int) -> None:
        for _ in range(n):
            assert self.recorded.acquire(timeout=30)


def recompute_during(r: redis.Redis, conn: Any, s: HacoSettings, ws: Writers) -> list[Any]:
    """Two recomputes while the writers keep recording, each after a third of the total."""
    results = []
    for _ in range(2):
        ws.wait_recorded(ws.n * ws.per_writer // 3)
        res = recompute(r, conn, s)
        assert res.adopted and res.version is not None and not res.resumed
        assert delta_epochs(r) <= {res.epoch + 1}  # older deltas are gone
        results.append(res)
    return results


def test_recompute_needs_an_autocommit_connection(r: redis.Redis, db: str) -> None:
    with psycopg.connect(db) as tx, pytest.raises(InputError, match=r"recompute .*autocommit"):
        recompute(r, tx, hsettings())
    assert r.get(keys.PROFILE_EPOCH) is None  # refused before sealing anything


def test_recompute_while_outcomes_arrive_counts_each_exactly_once(
    r: redis.Redis, redis_url: str, pool: ConnectionPool, db: str, conn: Any
) -> None:
    s = hsettings()
    ws = Writers(redis_url, 4, 150)
    stop = threading.Event()
    harvesting = threading.Thread(target=Harvester(r, pool, s, "h-e2e").run, args=(stop,))
    for t in [*ws.threads, harvesting]:
        t.start()
    try:
        results = recompute_during(r, conn, s, ws)
        ws.gate.set()
        for t in ws.threads:
            t.join()
        assert ws.errors == []
        wait_for("the harvester to drain the stream", lambda: r.xlen(keys.TRACES) == 0, 20)
    finally:
        ws.gate.set()
        stop.set()
        harvesting.join()

    traces = ws.traces
    assert len(traces) == ws.n * ws.per_writer
    want_c, want_l = expected(traces, stream_order(db), INF)
    by_cand = {c: sum(1 for t in traces if t.candidate_id == c and observations(t)[0])
               for c in ZONES}  # fmt: skip
    assert {c: p.calls for c, p in want_c.items()} == by_cand
    store = RedisStore(r)
    # Snapshot of the second recompute + the deltas since: every outcome exactly once.
    view = store.load_view(list(ZONES), list(want_l))
    assert view.version == results[-1].version and view.snapshot_epoch == 1
    assert delta_epochs(r) == {2}
    assert counts(view.candidates) == counts(want_c)
    for c in want_c:
        assert_same(view.candidates[c], want_c[c], c)
    for lk in want_l:
        assert_same(view.links[lk], want_l[lk], lk)
    # A third recompute moves everything into the snapshot: the same profiles, no deltas.
    results.append(recompute(r, conn, s))
    versions = [res.version for res in results]
    assert versions == sorted(versions) and len(set(versions)) == 3
    assert [res.epoch for res in results] == [0, 1, 2]
    assert delta_epochs(r) == set()
    after = store.load_view(list(ZONES), list(want_l))
    assert after.version == versions[-1]
    assert counts(after.candidates) == counts(want_c)
    for c in want_c:
        assert_same(after.candidates[c], want_c[c], c)
    with psycopg.connect(db) as pg:
        stored = pg.execute("SELECT array_agg(version ORDER BY version) FROM profile_snapshots")
        assert stored.fetchone() == (versions,)
    names = r.keys("*")
    assert names and {k: r.pttl(k) > 0 for k in names} == dict.fromkeys(names, True)


def test_a_recompute_waits_for_the_harvester_and_the_next_one_resumes_its_seal(
    r: redis.Redis, pool: ConnectionPool, conn: Any
) -> None:
    rng, now = random.Random(3), time.time()
    store = RedisStore(r)
    ok = [make_trace(i, "c0", rng, now) for i in range(40)]
    for t in ok:
        record(store, t)
    with pytest.raises(StoreError, match="has not stored every trace up to"):
        recompute(r, conn, hsettings(recompute_wait_s=0.2))
    assert r.get(keys.PROFILE_EPOCH) == b"1"
    assert r.exists(keys.PROFILE_SEAL) and not r.exists(keys.PROFILE_SNAPSHOT)
    for t in [make_trace(100 + i, "c0", rng, now) for i in range(10)]:
        record(store, t)  # epoch 1: after the watermark
        ok.append(t)
    mid = store.load_view(["c0"], [])  # no snapshot: every epoch's delta counts
    assert mid.version is None and mid.epoch == 1
    drain(Harvester(r, pool, hsettings(), "h"))
    res = recompute(r, conn, hsettings())
    assert res.resumed and res.epoch == 0 and res.adopted
    assert r.get(keys.PROFILE_EPOCH) == b"1"  # resumed, not sealed again
    assert not r.exists(keys.PROFILE_SEAL)
    view = store.load_view(["c0"], [])
    assert view.version == res.version and view.snapshot_epoch == 0
    n = sum(1 for t in ok if observations(t)[0])
    assert view.candidates["c0"].calls == n == mid.candidates["c0"].calls


def test_recompute_without_any_trace_publishes_an_empty_snapshot(r: redis.Redis, conn: Any) -> None:
    res = recompute(r, conn, hsettings())
    assert res.adopted and res.candidates == 0 and res.epoch == 0
    assert res.watermark.endswith(f"-{epochs.SEQ_MAX}")  # no stream: just below "now"
    meta = epochs.snapshot_meta(r)
    assert meta is not None and meta["version"] == res.version and meta["candidates"] == 0


def test_a_stale_snapshot_is_not_adopted_over_a_newer_one(r: redis.Redis) -> None:
    old, new = epochs.seal(r, 60), None
    r.delete(keys.PROFILE_SEAL)
    new = epochs.seal(r, 60)
    assert (old.epoch, new.epoch) == (0, 1)
    assert epochs.publish(r, epochs.Snapshot(2, new, {}, {}), 60)
    assert not epochs.publish(r, epochs.Snapshot(1, old, {}, {}), 60)
    assert epochs.snapshot_meta(r) == {"version": 2, "epoch": 1, "watermark": new.watermark}


def test_a_concurrent_recompute_is_skipped(r: redis.Redis, conn: Any, db: str) -> None:
    with connect(db) as other:
        other.execute("SELECT pg_advisory_lock(%s)", [RECOMPUTE_LOCK])
        res = recompute(r, conn, hsettings())
    assert res.version is None and not res.adopted
    assert not r.exists(keys.PROFILE_EPOCH)  # it did not even seal


def test_memory_store_records_an_outcome_like_the_three_calls() -> None:
    rng = random.Random(1)
    a, b = MemoryStore(), MemoryStore()
    for i in range(30):
        t = make_trace(i, rng.choice(list(ZONES)), rng, 1000.0 + i)
        obs, legs = observations(t)
        lid = link_id(t.caller_zone, t.zone)
        a.record_outcome(t.candidate_id, obs, lid, t.caller_zone, t.zone, legs,
                         f"r{i}", INF, LIMITS)  # fmt: skip
        if obs is not None:
            b.update_candidate(t.candidate_id, obs, INF, 1.0)
        if legs:
            b.update_link(lid, t.caller_zone, t.zone, legs, INF, 1.0)
        b.append_trace(f"r{i}", LIMITS.trace_maxlen, 1.0)
    assert (a.candidates, a.links, a.traces) == (b.candidates, b.links, b.traces)


# ---------------------------------------------------------------- CLI and Celery


def test_profiles_and_recompute_commands(
    r: redis.Redis, redis_url: str, pool: ConnectionPool, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cands = [c for c in default_pool().candidates if c.role == "coder"][:2]
    rng, now = random.Random(5), time.time()
    store = RedisStore(r)
    for i in range(30):
        c = cands[i % 2]
        t = make_trace(i, "c0", rng, now).model_copy(update={"candidate_id": c.id, "zone": c.zone})
        record(store, t)
    drain(Harvester(r, pool, hsettings(), "h"))
    monkeypatch.setattr(cli_profiles, "_redis", lambda s: redis.Redis.from_url(redis_url))
    monkeypatch.setenv("HACO_DATABASE_URL", db)
    runner = CliRunner()
    res = runner.invoke(app, ["recompute"])
    assert res.exit_code == 0, res.output
    version = json.loads(res.stdout)["version"]
    res = runner.invoke(app, ["profiles", "--role", "coder"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["snapshot"]["version"] == version
    rows = {row["candidate"]: row for row in out["profiles"]}
    assert set(rows) == {c.id for c in default_pool().candidates if c.role == "coder"}
    for c in cands:
        row = rows[c.id]
        assert row["snapshot_version"] == version and row["zone"] == c.zone
        assert row["calls"] > 0 and 0 < row["mu"] < 1 and 0 <= row["rho"] <= 1
        assert row["last_seen"] is not None
    assert "μ ± σ" in res.stderr
    res = runner.invoke(app, ["profiles", "--role", "nobody"])
    assert res.exit_code == 2 and "unknown role" in res.output
    _, published = epochs.read_domains(r)  # one entry per role of the pool
    assert len(published) == len({c.role for c in default_pool().candidates})


def test_a_recompute_whose_pool_config_does_not_load_still_publishes_its_snapshot(
    r: redis.Redis, redis_url: str, db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    bad = tmp_path / "pool.toml"
    bad.write_text("caller_zone = [", encoding="utf-8")
    monkeypatch.setattr(cli_profiles, "_redis", lambda s: redis.Redis.from_url(redis_url))
    monkeypatch.setenv("HACO_DATABASE_URL", db)
    monkeypatch.setenv("HACO_POOL_FILE", str(bad))
    res = CliRunner().invoke(app, ["recompute"])
    assert res.exit_code == 0, res.output
    said = res.stderr.replace("\n", "")  # as the console wrapped it
    assert "failure domains not published" in said and str(bad) in said
    assert epochs.snapshot_meta(r) is not None and epochs.read_domains(r)[1] == {}
    # The beat task: the same, logged.
    tasks: dict[str, Callable[[], None]] = {}
    fake = SimpleNamespace(
        conf=SimpleNamespace(beat_schedule=None),
        task=lambda **opts: lambda fn: tasks.setdefault(opts["name"], fn),
    )
    register_maintenance(fake, HacoSettings(database_url=db, pool_file=bad), redis_url)
    with caplog.at_level(logging.WARNING, logger="workers.maintenance"):
        tasks[RECOMPUTE_TASK]()
    assert "failure domains not published" in caplog.text and str(bad) in caplog.text
    meta = epochs.snapshot_meta(r)
    assert meta is not None and meta["domain_pools"] == 0


def test_the_celery_app_schedules_the_recompute() -> None:
    s = HacoSettings(recompute_interval_s=15.0)
    celery_app = create_app(s, UNREACHABLE_REDIS_URL)  # nothing connects: config only
    # Every task is defined with shared=False, so apps created earlier in this process
    # add no copies (Celery would warn about duplicate task names, an error here).
    assert RECOMPUTE_TASK in celery_app.tasks
    entry = celery_app.conf.beat_schedule[SCHEDULE_ENTRY]
    assert entry["task"] == RECOMPUTE_TASK and entry["schedule"] == 15.0
    assert entry["options"]["queue"] == MAINTENANCE_QUEUE
    assert celery_app.tasks[RECOMPUTE_TASK].ignore_result


def test_the_recompute_task_runs_one_recompute(
    r: redis.Redis, redis_url: str, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks: dict[str, Callable[[], None]] = {}
    fake = SimpleNamespace(
        conf=SimpleNamespace(beat_schedule=None),
        task=lambda **opts: lambda fn: tasks.setdefault(opts["name"], fn),
    )
    settings = HacoSettings(database_url=db)
    register_maintenance(fake, settings, redis_url)
    tasks[RECOMPUTE_TASK]()
    meta = epochs.snapshot_meta(r)
    assert meta is not None
    # The failure domains of each role of the worker's pool config, published with it.
    pools = domain_pools(Pool(pool_from_settings(settings)))
    _, published = epochs.read_domains(r)
    assert pools and meta["domain_pools"] == len(pools)
    assert set(published) == {domains.pool_key(p, ProfileSettings()) for p in pools}


def test_the_retention_task_keeps_partitions_ahead(db: str, redis_url: str) -> None:
    tasks: dict[str, Callable[[], None]] = {}
    fake = SimpleNamespace(
        conf=SimpleNamespace(beat_schedule=None),
        task=lambda **opts: lambda fn: tasks.setdefault(opts["name"], fn),
    )
    register_maintenance(fake, HacoSettings(database_url=db, retention_interval_s=60.0), redis_url)
    assert fake.conf.beat_schedule[RETENTION_ENTRY]["schedule"] == 60.0
    tasks[RETENTION_TASK]()
    with psycopg.connect(db) as c:
        names = {
            row[0]
            for row in c.execute(
                "SELECT relname FROM pg_class WHERE relname LIKE 'members_2%'"
            ).fetchall()
        }
    assert f"members_{datetime.now(UTC):%Y%m%d}" in names  # today's partition exists
    assert len(names) >= 7


def test_the_worker_counts_what_the_recompute_reads_from_its_trace() -> None:
    """workers.member folds the reading of the trace it appends (with the link legs its
    backend measured); the recompute reads the same trace. ``delivered`` is not traced:
    the reading's inference must agree with what the backend knew."""
    from workers.backends.base import BackendResult
    from workers.member import MemberContext, _commit_once, _report_and_harvest
    from workers.member_report import member_report, status_of

    store = MemoryStore()
    ctx = MemberContext(store=store, backends=lambda t: None, settings=HacoSettings())  # type: ignore[arg-type,return-value]
    legs = [LinkObservation(1.0, 800.0, False, 0.01, 0.03), LinkObservation(1.0, 90.0, True)]
    results = [
        BackendResult(None, quality=0.7, tokens_in=5, tokens_out=9, proc_latency_s=0.4,
                      bytes_sent=800, rtt_s=0.03, bandwidth_Bps=8e4, link_observations=legs),
        BackendResult(FailureKind.INTERNAL, "boom", tokens_in=5, proc_latency_s=0.2,
                      bytes_sent=800, rtt_s=0.03, bandwidth_Bps=8e4),
        BackendResult(FailureKind.NETWORK, "lost", bytes_sent=800, lost=True, delivered=False),
        BackendResult(FailureKind.NETWORK, "lost", tokens_in=5, tokens_out=3, proc_latency_s=0.3,
                      bytes_sent=800, rtt_s=0.03, bandwidth_Bps=8e4, lost=True),
        BackendResult(FailureKind.CANCELLED, "cancelled while running"),
        BackendResult(None, quality=0.2, tokens_in=5, tokens_out=9, proc_latency_s=0.5,
                      bytes_sent=800, rtt_s=0.03, bandwidth_Bps=8e4),  # its key is taken
    ]  # fmt: skip
    cand = default_pool().candidates[0]
    store.claim_idempotency("k", "other.0", 60.0)
    traces = []
    for i, res in enumerate(results):
        task = MemberTask(
            group_id=f"g{i}", member_id=f"g{i}.0", rank=0, candidate=cand, caller_zone="local",
            payload=[], deadline_at_s=2e9, enqueued_at_s=1000.0 + i,
            idempotency_key="k" if i == len(results) - 1 else None,
        )  # fmt: skip
        outcome = _commit_once(task, None, res, ctx)  # type: ignore[arg-type]
        report = member_report(task, outcome, 1000.0 + i, 1000.5 + i, status_of(outcome))
        _report_and_harvest(task, res.link_observations, report, ctx)
        traces.append(report.trace)
        obs = observations(report.trace)[0]
        assert obs is None or obs.delivered == res.delivered, i
    assert traces[-1].failure_kind is FailureKind.IDEMPOTENCY_TAKEN
    assert "already taken" in (traces[-1].failure_reason or "")  # for people, not code
    want = reduce(
        lambda p, o: update_candidate(p, o, INF),
        [o for o in (observations(t)[0] for t in traces) if o is not None],
        CandidateProfile(cand.id),
    )
    assert_same(store.candidates[cand.id], want)
    assert want.calls == 5 and want.successes == 2 and want.delivered == 4
    # The worker folds the measured legs of the first call (both); the others measured
    # none, so their trace's own row, the one the recompute reads: a call that failed or
    # was lost before its backend measured anything still counts once towards its link's
    # loss rate (before, it did not count online at all, and online and recompute
    # disagreed on the loss rate of the same calls).
    read = [*legs, *(lo for t in traces[1:] for lo in observations(t)[1])]
    link = reduce(lambda p, o: update_link(p, o, INF), read, LinkProfile("local", cand.zone))
    assert store.links == {link_id("local", cand.zone): link}
    # Trials: the 2 legs, then the internal failure and the two lost calls (the cancelled
    # member is no observation; the one whose key was taken traced no transmission).
    assert (link.transmissions, link.losses) == (5.0, 3.0)


def test_waiting_for_the_harvester_times_out_on_the_injected_clock(r: redis.Redis) -> None:
    entry = r.xadd(keys.TRACES, {"report": "{}"})
    watermark = entry.decode() if isinstance(entry, bytes) else str(entry)
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:  # virtual time: nothing waits
        slept.append(s)
        now[0] += s

    with pytest.raises(StoreError, match="recompute_wait_s=1"):
        wait_harvested(r, watermark, 1.0, clock=lambda: now[0], sleep=sleep)
    assert now[0] >= 1.0 and slept  # it polled until the deadline, in virtual time
    r.delete(keys.TRACES)
