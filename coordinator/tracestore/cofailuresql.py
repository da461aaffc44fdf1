"""The recompute's co-failure evidence (coordinator.core.cofailure) from the trace store.

The groups whose members are in the recompute's cut (the same watermark, window and
observation filter as the profiles: coordinator.tracestore.profilesql) are read and
folded in the order they completed (their last member's finish; ties by group id in code
point order) with :func:`coordinator.core.cofailure_batch.fold_batch`, which gives the
value of :func:`coordinator.core.cofailure.fold_groups`, the very fold the simulator runs
online. A member's failure score is the one reading of
:func:`coordinator.core.cofailure.failure_score`: 1 when it failed (a timeout included),
``1 − quality`` for a success judged by the seal, 0 for a success not judged yet.

SQL gathers one row per group of two members or more: its members packed in one bytea
(per member an int8 candidate key and a float8 score) and its completion time. What costs
is moving 1M member rows through Postgres and into Python, so the query moves little:

- the key is ``hashtextextended(candidate_id, seed)``, not the id (text to decode per
  member) nor a number joined from the candidate list (0.3–0.4 s more over the 1M
  member rows of bench/recompute.py). The candidates are listed first, by a skip scan
  of the ``(candidate_id, finished_at)`` index (1 ms), with a seed under which their
  keys are distinct, so a key names one candidate;
- no per-group sort or distinct-candidate test (text comparisons under the database's
  collation): a group of one candidate twice gives no pair in the fold; the groups are
  ordered in numpy.
"""

from __future__ import annotations

from datetime import datetime
from operator import itemgetter
from typing import Any

import numpy as np
import psycopg

from coordinator.core.cofailure import CoFailure
from coordinator.core.cofailure_batch import fold_batch
from coordinator.core.params import ProfileSettings
from coordinator.errors import DatabaseError
from coordinator.tracestore.profilesql import OBSERVED, OK, split_id

Conn = psycopg.Connection[Any]

# Every candidate id in the table, one index probe each (a superset of the cut's).
_CANDIDATES = """
WITH RECURSIVE c AS (
    (SELECT candidate_id FROM members ORDER BY candidate_id LIMIT 1)
    UNION ALL
    SELECT (SELECT m.candidate_id FROM members m WHERE m.candidate_id > c.candidate_id
            ORDER BY m.candidate_id LIMIT 1)
    FROM c WHERE c.candidate_id IS NOT NULL
)
SELECT candidate_id, hashtextextended(candidate_id, %(seed)s) FROM c
WHERE candidate_id IS NOT NULL
"""

# done_s as float8, not numeric, which is slow to decode.
_GROUPS = f"""
SELECT group_id,
       string_agg(int8send(hashtextextended(candidate_id, %(seed)s))
                  || float8send(CASE WHEN {OK}
                                     THEN CASE WHEN quality IS NOT NULL
                                                AND (judged_at IS NULL
                                                     OR judged_at <= %(sealed_at)s)
                                               THEN 1.0 - quality ELSE 0.0 END
                                     ELSE 1.0 END),
                  ''::bytea) AS members,
       extract(epoch FROM max(finished_at))::float8 AS done_s
FROM members
WHERE finished_at >= %(since)s
  AND {OBSERVED}
  AND (split_part(stream_id, '-', 1)::bigint, split_part(stream_id, '-', 2)::bigint)
      <= (%(w_ms)s, %(w_seq)s)
GROUP BY group_id
HAVING count(*) > 1
"""

_MEMBER = np.dtype([("key", ">i8"), ("phi", ">f8")])  # int8send || float8send: big-endian
# Seeds tried for distinct keys: two of n candidates collide under one with probability
# about n²/2⁶⁵, so the second is all but never needed.
_SEEDS = 8


def aggregate_cofailure(
    conn: Conn, watermark: str, since: datetime, sealed_at: datetime, settings: ProfileSettings
) -> CoFailure:
    """The co-failure evidence of the groups in the recompute's cut (module docstring)."""
    w_ms, w_seq = split_id(watermark)
    params = {"since": since, "sealed_at": sealed_at, "w_ms": w_ms, "w_seq": w_seq}
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        seed, keys = _candidate_keys(conn)
        rows = conn.execute(_GROUPS.encode(), {**params, "seed": seed}, binary=True).fetchall()
    if not rows:
        return CoFailure()
    ids = sorted(keys)  # code point order: a pair is kept as (a, b) with a < b
    by_key = np.array([keys[c] for c in ids], dtype=np.int64)
    key_order = np.argsort(by_key)
    members = np.frombuffer(b"".join(map(itemgetter(1), rows)), dtype=_MEMBER)
    at = key_order[np.searchsorted(by_key[key_order], members["key"]).clip(0, len(ids) - 1)]
    if not (by_key[at] == members["key"]).all():
        raise DatabaseError("a member's candidate key is not among the listed candidates")
    done_s = np.fromiter(map(itemgetter(2), rows), np.float64, len(rows))
    order = np.argsort(done_s, kind="stable")
    if (np.diff(done_s[order]) == 0).any():  # ties: by group id
        order = np.lexsort((np.array([r[0] for r in rows]), done_s))
    rank = np.empty(len(rows), np.int64)
    rank[order] = np.arange(len(rows))
    lengths = map(len, map(itemgetter(1), rows))
    sizes = np.fromiter(lengths, np.int64, len(rows)) // _MEMBER.itemsize
    group = np.repeat(rank, sizes)
    phi = np.clip(members["phi"], 0.0, 1.0)
    return fold_batch(ids, group, at, phi, done_s[order], settings)


def _candidate_keys(conn: Conn) -> tuple[int, dict[str, int]]:
    """A seed and the candidates' keys under it, distinct."""
    for seed in range(_SEEDS):
        rows = conn.execute(_CANDIDATES, {"seed": seed}).fetchall()
        keys = {str(c): int(k) for c, k in rows}
        if len(set(keys.values())) == len(keys):
            return seed, keys
    raise DatabaseError(f"no seed in 0…{_SEEDS - 1} gives the candidates distinct keys")
