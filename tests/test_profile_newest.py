"""The newest traces of each candidate (coordinator.tracestore.profilesql reads them in
arrays, one row per candidate): the recent-latency window and the last times of the
candidates and their links, as the fold has them, also where a candidate's newest
traces observe no link."""

from __future__ import annotations

import random
import time

import pytest
import redis
from psycopg_pool import ConnectionPool
from test_recompute import (
    BY_TIME,
    CALLER,
    INF,
    ZONES,
    _ts,
    assert_same,
    drain,
    expected,
    hsettings,
    make_trace,
    record,
    stream_order,
)  # fmt: skip

from coordinator.core.params import ProfileSettings
from coordinator.state import keys
from coordinator.state.store import RedisStore
from coordinator.tracestore.db import connect
from coordinator.tracestore.harvester import Harvester
from coordinator.tracestore.profilesql import aggregate
from schemas.models import MemberTrace

NO_LINK = {"bytes_sent": 0, "rtt_s": None, "bandwidth_Bps": None, "lost": False}


def linkless(t: MemberTrace) -> MemberTrace:
    """A success that observes its candidate and not its link."""
    fields = {"status": "succeeded", "success": True, "failure_kind": None,
              "failure_reason": None, "quality": 0.5, "proc_latency_s": 0.7}  # fmt: skip
    return MemberTrace.model_validate({**t.model_dump(), **NO_LINK, **fields})


@pytest.mark.parametrize("cfg", [INF, BY_TIME], ids=["inf", "seconds"])
def test_newest_traces_without_a_link_observation_leave_the_link_last_time(
    r: redis.Redis, pool: ConnectionPool, db: str, cfg: ProfileSettings
) -> None:
    rng = random.Random(11)
    now = time.time()
    store = RedisStore(r, cfg)
    traces = [make_trace(i, cand, rng, now + i) for i, cand in enumerate(list(ZONES) * 8)]
    # Each candidate's newest two traces observe no link: its link's last trace is older.
    traces += [linkless(make_trace(100 + i, cand, rng, now + 100 + i))
               for i, cand in enumerate(list(ZONES) * 2)]  # fmt: skip
    for t in traces:
        record(store, t, cfg)
    last = r.xinfo_stream(keys.TRACES)["last-generated-id"].decode()
    drain(Harvester(r, pool, hsettings(), "h"))
    with connect(db) as conn:
        cands, links = aggregate(conn, last, _ts(now - 3600), _ts(now + 10**6), cfg)
    want_c, want_l = expected(traces, stream_order(db), cfg)
    assert sorted(cands) == sorted(want_c) and sorted(links) == sorted(want_l)
    for c in want_c:
        assert_same(cands[c], want_c[c], c, 1e-6)
        assert cands[c].last_seen_s == pytest.approx(max(
            t.finished_at_s for t in traces if t.candidate_id == c), abs=1e-5)  # fmt: skip
    for lk in want_l:
        assert_same(links[lk], want_l[lk], lk, 1e-6)
    us = links[f"{CALLER}->us"].last_seen_s  # c0 and c2 are in "us"
    assert us is not None and us < now + 100
