"""The recompute's co-failure evidence (coordinator.core.cofailure) from the trace store.

The groups whose members are in the recompute's cut (the same watermark, window and
observation filter as the profiles: coordinator.tracestore.profilesql) and that ran at
least two distinct candidates are read in the order they completed (their last member's
finish), and folded with :func:`coordinator.core.cofailure.fold_groups`, the very fold the
simulator runs online. A member's failure score is the one reading of
:func:`coordinator.core.cofailure.failure_score`: 1 when it failed (a timeout included),
``1 − quality`` for a success judged by the seal, 0 for a success not judged yet.

SQL gathers one row per group (arrays of candidate ids and scores); the fold is Python:
it is a few pairs per group, and the pure fold is what makes the snapshot the value
folding the same groups online gives.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

from coordinator.core.cofailure import CoFailure, fold_groups
from coordinator.core.params import ProfileSettings
from coordinator.tracestore.profilesql import OBSERVED, OK, split_id

Conn = psycopg.Connection[Any]

# The arrays are in no particular order (the fold sorts a group's candidates itself), and
# "two distinct candidates" is min <> max: per-group sorts for either cost Postgres 0.7 s
# of 1.8 s over 1M member rows (bench/recompute.py). done_s as float8, not numeric,
# which is slow to decode.
_GROUPS = f"""
SELECT group_id,
       array_agg(candidate_id) AS ids,
       array_agg(CASE WHEN {OK}
                      THEN CASE WHEN quality IS NOT NULL
                                 AND (judged_at IS NULL OR judged_at <= %(sealed_at)s)
                                THEN 1.0 - quality ELSE 0.0 END
                      ELSE 1.0 END) AS phis,
       extract(epoch FROM max(finished_at))::float8 AS done_s
FROM members
WHERE finished_at >= %(since)s
  AND {OBSERVED}
  AND (split_part(stream_id, '-', 1)::bigint, split_part(stream_id, '-', 2)::bigint)
      <= (%(w_ms)s, %(w_seq)s)
GROUP BY group_id
HAVING min(candidate_id) <> max(candidate_id)
ORDER BY done_s, group_id
"""


def aggregate_cofailure(
    conn: Conn, watermark: str, since: datetime, sealed_at: datetime, settings: ProfileSettings
) -> CoFailure:
    """The co-failure evidence of the groups in the recompute's cut (module docstring)."""
    w_ms, w_seq = split_id(watermark)
    params = {"since": since, "sealed_at": sealed_at, "w_ms": w_ms, "w_seq": w_seq}
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        rows = conn.execute(_GROUPS.encode(), params, binary=True).fetchall()
    # One fold over every group: folding them one at a time copied the evidence's pairs
    # per group, a quarter of the fold's time over 1M member rows (bench/recompute.py).
    groups = (
        ([(str(c), min(1.0, max(0.0, float(p)))) for c, p in zip(ids, phis, strict=True)],
         float(done_s))
        for _group, ids, phis, done_s in rows
    )  # fmt: skip
    return fold_groups(CoFailure(), groups, settings)
