"""The recompute's co-failure evidence (coordinator.core.cofailure) from the trace store.

The groups whose members are in the recompute's cut (the same watermark, window and
observation filter as the profiles: coordinator.tracestore.profilesql) are read and
folded in the order they completed (their last member's finish; ties by group id in code
point order) with :func:`coordinator.core.cofailure_batch.fold_sums`, which gives the
value of :func:`coordinator.core.cofailure.fold_groups`, the very fold the simulator runs
online. A member's failure score is the one reading of
:func:`coordinator.core.cofailure.failure_score`: 1 when it failed (a timeout included),
``1 − quality`` for a success judged by the seal, 0 for a success not judged yet.

SQL packs the groups of two members or more per minute of completion (:data:`BUCKET_S`):
a row per minute, in order, holding its groups' members (per member an int8 candidate
key and a float8 score), their sizes and completion times, and their ids. The rows are
streamed and folded a batch of whole minutes at a time (:data:`BATCH_MEMBERS` members, or
a minute's if more), each batch from the sums of the ones before, so that the process
holds a batch, not the window: read whole, the window took 250 B a member (247 MB at the
peak over the 1M member rows of bench/recompute.py, a day of stored traces), and the
default window, a week, holds seven such days. What costs is moving the members through
Postgres and into Python, so the query moves little:

- the key is ``hashtextextended(candidate_id, seed)``, not the id (text to decode per
  member) nor a number joined from the candidate list (0.3–0.4 s more over the 1M
  member rows). The candidates are listed first, by a skip scan of the
  ``(candidate_id, finished_at)`` index (1 ms), with a seed under which their keys are
  distinct, so a key names one candidate;
- no per-group sort or distinct-candidate test (text comparisons under the database's
  collation): a group of one candidate twice gives no pair in the fold; a batch's groups
  are ordered in numpy, and a group's id (its UTF-8 bytes, whose order is code point
  order) is looked at only where completion times tie.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import numpy as np
import psycopg

from coordinator.core.cofailure import CoFailure
from coordinator.core.cofailure_batch import PairSums, fold_sums
from coordinator.core.params import ProfileSettings
from coordinator.errors import DatabaseError, InputError
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

# A bucket is a minute of completions: a batch holds at least one (it is never split), and
# a busy fleet's minute is far below a batch. A week is 10 080 rows, each a few µs.
BUCKET_S = 60

# Members folded at once (or a bucket's, if more). The fold holds about 220 B a member:
# 22 MB a batch. Over the 1M member rows of bench/recompute.py, batches of 50 000 to all
# of them took the same time, to the machine's noise.
BATCH_MEMBERS = 100_000

# done_s as float8, not numeric, which is slow to decode. Within a bucket the groups come
# in no particular order, but each string_agg of one row sees them in the same order.
_GROUPS = f"""
SELECT floor(done_s / {BUCKET_S})::int8 AS bucket,
       string_agg(members, ''::bytea),
       string_agg(int4send(n) || float8send(done_s) || int4send(octet_length(gid)), ''::bytea),
       string_agg(gid, ''::bytea)
FROM (
    SELECT convert_to(group_id, 'UTF8') AS gid,
           string_agg(int8send(hashtextextended(candidate_id, %(seed)s))
                      || float8send(CASE WHEN {OK}
                                         THEN CASE WHEN quality IS NOT NULL
                                                    AND (judged_at IS NULL
                                                         OR judged_at <= %(sealed_at)s)
                                                   THEN 1.0 - quality ELSE 0.0 END
                                         ELSE 1.0 END),
                      ''::bytea) AS members,
           count(*)::int4 AS n,
           extract(epoch FROM max(finished_at))::float8 AS done_s
    FROM members
    WHERE finished_at >= %(since)s
      AND {OBSERVED}
      AND (split_part(stream_id, '-', 1)::bigint, split_part(stream_id, '-', 2)::bigint)
          <= (%(w_ms)s, %(w_seq)s)
    GROUP BY group_id
    HAVING count(*) > 1
) g
GROUP BY bucket
ORDER BY bucket
"""

_MEMBER = np.dtype([("key", ">i8"), ("phi", ">f8")])  # int8send || float8send: big-endian
_GROUP = np.dtype([("n", ">i4"), ("done_s", ">f8"), ("id_bytes", ">i4")])
# Seeds tried for distinct keys: two of n candidates collide under one with probability
# about n²/2⁶⁵, so the second is all but never needed.
_SEEDS = 8


def aggregate_cofailure(
    conn: Conn,
    watermark: str,
    since: datetime,
    sealed_at: datetime,
    settings: ProfileSettings,
    batch_members: int = BATCH_MEMBERS,
) -> CoFailure:
    """The co-failure evidence of the groups in the recompute's cut (module docstring)."""
    if batch_members < 1:
        raise InputError(f"batch_members {batch_members!r}; expected at least 1")
    w_ms, w_seq = split_id(watermark)
    params = {"since": since, "sealed_at": sealed_at, "w_ms": w_ms, "w_seq": w_seq}
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        conn.execute("SET LOCAL jit = off")  # compiling costs more than it saves here
        # work_mem stays the server's: at 64 MB the per-minute packing no longer spills,
        # but the workers' in-memory sorts cost more than they save (0.2 s of CPU more
        # over 1M member rows, nine alternations).
        seed, keys = _candidate_keys(conn)
        fold = _Fold(keys, settings)
        with conn.cursor() as cur:
            buckets = cur.stream(_GROUPS.encode(), {**params, "seed": seed}, binary=True)
            fold.add(buckets, batch_members)
    return CoFailure(fold.sums.pairs(fold.ids))


class _Fold:
    """The sums of the buckets folded so far."""

    def __init__(self, keys: dict[str, int], settings: ProfileSettings) -> None:
        self.ids = sorted(keys)  # code point order: a pair is kept as (a, b) with a < b
        by_key = np.array([keys[c] for c in self.ids], dtype=np.int64)
        self._key_order = np.argsort(by_key)
        self._sorted_keys = by_key[self._key_order]
        self.settings = settings
        self.sums = PairSums.empty()

    def add(self, buckets: Iterable[tuple[Any, ...]], batch_members: int) -> None:
        parts: list[tuple[bytes, bytes, bytes]] = []
        held = 0
        for _, members, groups, gids in buckets:
            parts.append((members, groups, gids))
            held += len(members) // _MEMBER.itemsize
            if held >= batch_members:
                self._fold(parts)
                parts, held = [], 0
        if parts:
            self._fold(parts)

    def _fold(self, parts: Sequence[tuple[bytes, bytes, bytes]]) -> None:
        members = np.frombuffer(b"".join(p[0] for p in parts), dtype=_MEMBER)
        groups = np.frombuffer(b"".join(p[1] for p in parts), dtype=_GROUP)
        sizes = groups["n"].astype(np.int64)
        if int(sizes.sum()) != members.size:
            raise DatabaseError(f"{members.size} members packed for groups whose sizes add "
                                f"up to {sizes.sum()}; expected the same count")  # fmt: skip
        found = np.searchsorted(self._sorted_keys, members["key"]).clip(0, len(self.ids) - 1)
        at = self._key_order[found]
        if not (self._sorted_keys[found] == members["key"]).all():
            raise DatabaseError("a member's candidate key is not among the listed candidates")
        done_s = groups["done_s"].astype(np.float64)
        order = _completion_order(done_s, groups["id_bytes"], b"".join(p[2] for p in parts))
        rank = np.empty(order.size, np.int64)
        rank[order] = np.arange(order.size)
        phi = np.clip(members["phi"], 0.0, 1.0)
        self.sums = fold_sums(self.ids, np.repeat(rank, sizes), at, phi, done_s[order],
                              self.settings, self.sums)  # fmt: skip


def _completion_order(done_s: np.ndarray, id_bytes: np.ndarray, ids: bytes) -> np.ndarray:
    """The groups by completion time, ties by id (UTF-8 bytes: code point order)."""
    order = np.argsort(done_s, kind="stable")
    tied = np.r_[False, done_s[order][1:] == done_s[order][:-1]]
    if not tied.any():
        return order
    at = np.flatnonzero(tied | np.r_[tied[1:], False])  # every group of a tie
    ends = np.cumsum(id_bytes.astype(np.int64))
    names = np.array([ids[ends[g] - id_bytes[g] : ends[g]] for g in order[at]], dtype=bytes)
    order[at] = order[at][np.lexsort((names, done_s[order[at]]))]
    return order


def _candidate_keys(conn: Conn) -> tuple[int, dict[str, int]]:
    """A seed and the candidates' keys under it, distinct."""
    for seed in range(_SEEDS):
        rows = conn.execute(_CANDIDATES, {"seed": seed}).fetchall()
        keys = {str(c): int(k) for c, k in rows}
        if len(set(keys.values())) == len(keys):
            return seed, keys
    raise DatabaseError(f"no seed in 0…{_SEEDS - 1} gives the candidates distinct keys")
