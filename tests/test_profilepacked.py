"""The recompute's aggregation with a half-life (coordinator.tracestore.profilepacked):
rows packed per group by Postgres, ordered and weighted in numpy. Against the pure fold
on stored rows the harvester's own path never makes: stream ids many hours apart (so a
candidate's rows come in several packed groups), stored out of stream order, finish
times that go back, and sequence numbers too large for the one-key sort."""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime

import psycopg
import pytest
from test_recompute import BY_OBS, BY_TIME, ZONES, assert_same, expected, make_trace

from coordinator.core.params import ProfileSettings
from coordinator.errors import DatabaseError
from coordinator.tracestore.db import connect
from coordinator.tracestore.harvestsql import trace_row, write
from coordinator.tracestore.profilepacked import BATCH_ROWS, packed_sums
from coordinator.tracestore.profilesql import aggregate, split_id

HOUR_MS = 3_600_000


@pytest.mark.parametrize("cfg", [BY_OBS, BY_TIME], ids=["observations", "seconds"])
@pytest.mark.parametrize("seq_top", [4, 2**40], ids=["small-seq", "huge-seq"])
@pytest.mark.parametrize("batch_rows", [1, 40, BATCH_ROWS], ids=["hourly", "by-40", "one"])
def test_rows_over_many_hours_stored_out_of_order_aggregate_as_the_fold(
    db: str, cfg: ProfileSettings, seq_top: int, batch_rows: int
) -> None:
    rng = random.Random(11)
    now = time.time()
    ms0 = 1_700_000_000_000
    traces, ids = [], []
    for i in range(300):
        # Finish times wander back and forth (the seconds decay counts only forward
        # steps); stream ids run over about 25 hours, several entries per millisecond.
        t = make_trace(i, rng.choice(list(ZONES)), rng, now + i * 2.0 + rng.uniform(-9, 9))
        traces.append(t)
        ids.append(f"{ms0 + (i // 3) * 1_000_000}-{(i % 3) * (seq_top // 3)}")
    stored = list(zip(traces, ids, strict=True))
    rng.shuffle(stored)  # the table's order is not the stream's
    with psycopg.connect(db) as pg, pg.cursor() as cur:
        write(cur, [(False, trace_row(t, sid)) for t, sid in stored])
    last = max(ids, key=split_id)
    assert split_id(last)[0] - ms0 > 24 * HOUR_MS
    with connect(db) as conn:
        since = datetime.fromtimestamp(now - 3600, UTC)
        until = datetime.fromtimestamp(now + 10**6, UTC)
        cands, links = aggregate(conn, last, since, until, cfg, batch_rows)
    want_c, want_l = expected(traces, {t.member_id: split_id(s) for t, s in stored}, cfg)
    assert sorted(cands) == sorted(want_c) and sorted(links) == sorted(want_l)
    # Postgres keeps finish times to the microsecond (as in test_recompute).
    rel = 1e-6 if cfg is BY_TIME else 1e-9
    for c in want_c:
        assert_same(cands[c], want_c[c], c, rel)
    for lk in want_l:
        assert_same(links[lk], want_l[lk], lk, rel)


def test_a_nan_written_by_hand_counts_as_absent(db: str) -> None:
    """The harvester stores no NaN; the packed records mark an absent value with one."""
    rng = random.Random(5)
    now = time.time()
    traces = [make_trace(i, "c0", rng, now + i) for i in range(40)]
    hit = next(t for t in traces if t.success and t.proc_latency_s is not None)
    ids = [f"{1_700_000_000_000 + i}-0" for i in range(len(traces))]
    order = {t.member_id: split_id(sid) for t, sid in zip(traces, ids, strict=True)}
    with psycopg.connect(db) as pg, pg.cursor() as cur:
        write(cur, [(False, trace_row(t, sid)) for t, sid in zip(traces, ids, strict=True)])
        cur.execute("UPDATE members SET proc_latency_s = 'NaN' WHERE member_id = %s",
                    (hit.member_id,))  # fmt: skip
    without = [t.model_copy(update={"proc_latency_s": None}) if t is hit else t for t in traces]
    want, _ = expected(without, order, BY_OBS)
    with connect(db) as conn:
        since, until = (datetime.fromtimestamp(now + d, UTC) for d in (-3600, 10**6))
        cands, _ = aggregate(conn, ids[-1], since, until, BY_OBS)
    assert_same(cands["c0"].latency, want["c0"].latency, "c0.latency")
    assert_same(cands["c0"].quality, want["c0"].quality, "c0.quality")


def test_a_packed_group_of_a_partial_record_is_a_database_error() -> None:
    with pytest.raises(DatabaseError, match=r"'c0' \('eu' → 'us'\) are 75 bytes.*74-byte"):
        packed_sums([("c0", "eu", "us", 7, b"\0" * 75)], BY_TIME)


def test_packed_groups_out_of_hour_order_are_a_database_error() -> None:
    groups = [("c0", "eu", "us", 8, b""), ("c0", "eu", "us", 7, b"")]
    with pytest.raises(DatabaseError, match=r"hour 7 after hour 8; expected them in order"):
        packed_sums(groups, BY_OBS)


def test_no_packed_groups_sum_to_no_profiles() -> None:
    assert packed_sums([], BY_OBS) == ({}, {})
