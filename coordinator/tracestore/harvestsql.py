"""The harvester's SQL (:mod:`coordinator.tracestore.harvester`): one batch of trace-stream
entries into Postgres in one transaction, without double counting. Two ways in:

:func:`write`, the deduplicating merge, for entries that may be stored already (read
again from the pending list, claimed from another consumer, or a batch the fast way
refused). The entries are ``COPY``'d into two temporary staging tables, member reports
and group verdicts, then one statement (every data-modifying CTE runs exactly once, on
one snapshot) merges them:

- ``members``: what is not there yet (``ON CONFLICT DO NOTHING`` on its key, member id and
  finish time, which every redelivery of an entry repeats: no second row);
- ``invocations``: one upsert per group, in group order (so concurrent harvesters cannot
  deadlock), adding only the newly inserted members to ``members`` and setting the
  verdict columns from the group's verdict unless it has one already: the first verdict
  is final, so a redelivered verdict changes nothing.

It returns the new member rows and the verdicts that found no verdict stored (as of the
statement's snapshot: two harvesters storing the same verdict at the same instant would
both count it, while the row stays right).

:func:`write_fresh`, for entries delivered for the first time: binary ``COPY`` straight
into ``members`` (the per-group counts computed here, as the merge would), then the same
``invocations`` upsert. A row already stored makes the ``COPY`` fail with a unique
violation, which aborts the transaction: the caller then stores the batch with
:func:`write`, so the fast way can never double count, only fall back.

Link observations are not stored apart: ``link_observations`` is a view of ``members``
(migration 0006).

Timestamps travel as microseconds since 2000-01-01 (:func:`epoch_us`, the exact
arithmetic of Postgres' ``to_timestamp``), in binary ``int8``: that is the binary form of
a ``timestamptz``, so both ways store the same instant bit for bit, and the same as rows
stored by the earlier ``to_timestamp`` merge (the key repeats on redelivery).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from schemas.enums import GroupState
from schemas.models import GroupVerdict, MemberTrace

Row = tuple[Any, ...]

# Postgres' epoch (2000-01-01) in Unix seconds.
PG_EPOCH_S = 946_684_800.0
US_PER_S = 1e6


def epoch_us(seconds: float) -> int:
    """Unix seconds as microseconds since 2000-01-01, rounded as ``to_timestamp`` does
    (``rint((s - epoch) * 1e6)``; Python's ``round`` is also half to even)."""
    return round((seconds - PG_EPOCH_S) * US_PER_S)


# One stream entry to stage: (is a verdict, its row). A member's row is in the column
# order of ``members``, a verdict's in that of ``haco_harvest_verdicts``; the last column
# of both is the entry's stream id.
Staged = tuple[bool, Row]


def trace_row(trace: MemberTrace, stream_id: str) -> Row:
    """The row of one trace (column order of ``members``)."""
    t = trace
    return (
        t.member_id, t.group_id or t.invocation_id, t.candidate_id, t.role, t.zone,
        t.caller_zone, t.model, t.rank, t.u_plus, t.r_minus, epoch_us(t.started_at_s),
        epoch_us(t.finished_at_s), t.status.value,
        t.failure_kind.value if t.failure_kind else None, t.failure_reason, t.quality,
        t.latency_s, t.proc_latency_s, t.tokens_in, t.tokens_out, t.bytes_sent, t.rtt_s,
        t.bandwidth_Bps, t.lost, stream_id,
    )  # fmt: skip


def verdict_row(v: GroupVerdict, stream_id: str) -> Row:
    """The staging row of one verdict (column order of ``haco_harvest_verdicts``)."""
    return (
        v.group_id, v.role, v.state.value, v.winner_member, v.p_success, v.stop.value,
        v.launch_mode.value, v.winner_mode.value, v.started_at_s, v.decided_at_s,
        v.latency_s, v.planned, v.launched, v.succeeded, v.failed, v.timed_out,
        v.cancelled, v.running, v.backups,
        v.winner_rule.value if v.winner_rule else None, v.fallback_reason, stream_id,
    )  # fmt: skip


_MEMBER_COLS = (
    "member_id, group_id, candidate_id, role, zone, caller_zone, model, rank, u_plus, "
    "r_minus, started_at, finished_at, status, failure_kind, failure_reason, quality, "
    "latency_s, proc_latency_s, tokens_in, tokens_out, bytes_sent, rtt_s, bandwidth_bps, "
    "lost, stream_id"
)
# Binary COPY types of a member row. Timestamps: see epoch_us. The staging table's
# integers are bigint, so an unchecked row's too-big count fails in Postgres (and is
# dead-lettered) instead of being cut to 32 bits by the binary int4 dumper.
_MEMBER_TYPES = (
    "text", "text", "text", "text", "text", "text", "text", "{int}", "float8", "float8",
    "int8", "int8", "text", "text", "text", "float8", "float8", "float8", "{int}", "{int}",
    "int8", "float8", "float8", "bool", "text",
)  # fmt: skip
_STAGE_TYPES = [t.format(int="int8") for t in _MEMBER_TYPES]
_FRESH_TYPES = [t.format(int="int4") for t in _MEMBER_TYPES]
_VERDICT_TYPES = [
    "text", "text", "text", "text", "float8", "text", "text", "text", "float8", "float8",
    "float8", *["int8"] * 8, "text", "text", "text",
]  # fmt: skip
_GROUP_TYPES = ["text", "text", "int4", "int8"]

_STAGE_DDL = """
CREATE TEMP TABLE IF NOT EXISTS haco_harvest_members (
    member_id text, group_id text, candidate_id text, role text, zone text,
    caller_zone text, model text, rank bigint, u_plus double precision,
    r_minus double precision, started_at timestamptz, finished_at timestamptz,
    status text, failure_kind text, failure_reason text, quality double precision,
    latency_s double precision, proc_latency_s double precision, tokens_in bigint,
    tokens_out bigint, bytes_sent bigint, rtt_s double precision,
    bandwidth_bps double precision, lost boolean, stream_id text
) ON COMMIT DELETE ROWS;
CREATE TEMP TABLE IF NOT EXISTS haco_harvest_verdicts (
    group_id text, role text, state text, winner_member text, p_success double precision,
    stop text, launch_mode text, winner_mode text, started_s double precision,
    decided_s double precision, latency_s double precision, planned bigint,
    launched bigint, succeeded bigint, failed bigint, timed_out bigint,
    cancelled bigint, running bigint, backups bigint, winner_rule text,
    fallback_reason text, stream_id text
) ON COMMIT DELETE ROWS;
CREATE TEMP TABLE IF NOT EXISTS haco_harvest_groups (
    group_id text, role text, n integer, created_at timestamptz
) ON COMMIT DELETE ROWS
"""

_COPY_STAGE = "COPY haco_harvest_members FROM STDIN (FORMAT BINARY)"
_COPY_VERDICTS = "COPY haco_harvest_verdicts FROM STDIN (FORMAT BINARY)"
_COPY_GROUPS = "COPY haco_harvest_groups FROM STDIN (FORMAT BINARY)"
_COPY_MEMBERS = f"COPY members ({_MEMBER_COLS}) FROM STDIN (FORMAT BINARY)"

# The verdict columns of invocations: set once, by the group's first verdict.
_VERDICT_COLS = (
    "state", "winner_member", "p_success", "stop", "launch_mode", "winner_mode",
    "latency_s", "decided_at", "planned", "launched", "succeeded", "failed", "timed_out",
    "cancelled", "running", "backups", "winner_rule", "fallback_reason",
)  # fmt: skip
_KEEP_FIRST = ",\n        ".join(
    f"{c} = CASE WHEN i.decided_at IS NULL THEN EXCLUDED.{c} ELSE i.{c} END" for c in _VERDICT_COLS
)

# The invocations upsert, after a CTE ``new_members`` (group_id, role, n, created_at).
_INVOCATIONS = f"""
verdicts AS (
    SELECT DISTINCT ON (group_id) * FROM haco_harvest_verdicts
    ORDER BY group_id, decided_s, stream_id
), fresh AS (
    SELECT v.group_id FROM verdicts v LEFT JOIN invocations i USING (group_id)
    WHERE i.decided_at IS NULL
), inv AS (
    INSERT INTO invocations AS i (group_id, role, members, created_at, {", ".join(_VERDICT_COLS)})
    SELECT group_id, coalesce(v.role, m.role), coalesce(m.n, 0),
        LEAST(m.created_at, to_timestamp(v.started_s)),
        coalesce(v.state, '{GroupState.RUNNING.value}'), v.winner_member, v.p_success,
        v.stop, v.launch_mode, v.winner_mode, v.latency_s, to_timestamp(v.decided_s),
        v.planned, v.launched, v.succeeded, v.failed, v.timed_out, v.cancelled, v.running,
        v.backups, v.winner_rule, v.fallback_reason
    FROM new_members m FULL JOIN verdicts v USING (group_id)
    ORDER BY group_id
    ON CONFLICT (group_id) DO UPDATE SET members = i.members + EXCLUDED.members,
        created_at = LEAST(i.created_at, EXCLUDED.created_at),
        {_KEEP_FIRST}
)"""

_MERGE = f"""
WITH ins AS (
    INSERT INTO members ({_MEMBER_COLS})
    SELECT {_MEMBER_COLS} FROM haco_harvest_members
    ON CONFLICT DO NOTHING
    RETURNING member_id, finished_at, group_id, role, started_at
), new_members AS (
    SELECT group_id, min(role) AS role, count(*) AS n, min(started_at) AS created_at
    FROM ins GROUP BY group_id
), {_INVOCATIONS}
SELECT (SELECT count(*) FROM ins), (SELECT count(*) FROM fresh)
"""

_FRESH_MERGE = f"""
WITH new_members AS (
    SELECT group_id, min(role) AS role, sum(n) AS n, min(created_at) AS created_at
    FROM haco_harvest_groups GROUP BY group_id
), {_INVOCATIONS}
SELECT count(*) FROM fresh
"""


def _copy(cur: psycopg.Cursor[Any], statement: str, types: Sequence[str], rows: Any) -> None:
    with cur.copy(statement.encode()) as copy:
        copy.set_types(types)
        for row in rows:
            copy.write_row(row)


def write(cur: psycopg.Cursor[Any], rows: list[Staged]) -> tuple[int, int]:
    """Stage ``rows`` and merge them (in the caller's transaction); returns the member
    rows inserted and the verdicts stored."""
    cur.execute(_STAGE_DDL)
    members = [row for verdict, row in rows if not verdict]
    verdicts = [row for verdict, row in rows if verdict]
    if members:
        _copy(cur, _COPY_STAGE, _STAGE_TYPES, members)
    if verdicts:
        _copy(cur, _COPY_VERDICTS, _VERDICT_TYPES, verdicts)
    cur.execute(_MERGE.encode())
    got = cur.fetchone()
    return (int(got[0]), int(got[1])) if got else (0, 0)


@dataclass(frozen=True, slots=True)
class FreshRows:
    """A first-delivered batch, ready for :func:`write_fresh`: member rows, verdict rows,
    and the members' count and earliest start per (group, role)."""

    members: list[Row]
    verdicts: list[Row]
    groups: list[Row]


def fresh_rows(rows: list[Staged]) -> FreshRows:
    """What the merge would derive from new member rows, derived here: the group counts
    (Postgres takes the minimum role, in its collation)."""
    members = [row for verdict, row in rows if not verdict]
    groups: dict[tuple[str, str], list[int]] = {}
    for row in members:
        gid, role, started = row[1], row[3], row[10]
        g = groups.get((gid, role))
        if g is None:
            groups[gid, role] = [1, started]
        else:
            g[0] += 1
            g[1] = min(g[1], started)
    counts = [(gid, role, n, at) for (gid, role), (n, at) in groups.items()]
    return FreshRows(members, [row for verdict, row in rows if verdict], counts)


def write_fresh(cur: psycopg.Cursor[Any], fresh: FreshRows) -> tuple[int, int]:
    """Like :func:`write`, for entries delivered for the first time whose integers are
    known to fit the columns (a binary ``int4`` keeps the low 32 bits of a bigger
    number): raises ``UniqueViolation`` if one is stored already, and the caller's
    transaction must then be rolled back and the batch merged instead."""
    cur.execute(_STAGE_DDL)
    for statement, types, rows in (
        (_COPY_MEMBERS, _FRESH_TYPES, fresh.members),
        (_COPY_GROUPS, _GROUP_TYPES, fresh.groups),
        (_COPY_VERDICTS, _VERDICT_TYPES, fresh.verdicts),
    ):
        if rows:
            _copy(cur, statement, types, rows)
    cur.execute(_FRESH_MERGE.encode())
    got = cur.fetchone()
    return len(fresh.members), int(got[0]) if got else 0
