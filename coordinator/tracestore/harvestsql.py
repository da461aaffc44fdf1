"""The harvester's SQL (:mod:`coordinator.tracestore.harvester`): one batch of trace-stream
entries into Postgres in one transaction, without double counting.

The entries are ``COPY``'d into two temporary staging tables, member reports and group
verdicts, then one statement (every data-modifying CTE runs exactly once, on one
snapshot) merges them:

- ``members``: what is not there yet (``ON CONFLICT DO NOTHING`` on its key, member id and
  finish time, which every redelivery of an entry repeats: no second row);
- ``link_observations``: the link row of each newly inserted member that is an observation
  and records a transmission (the reading of :mod:`coordinator.core.observations`);
- ``invocations``: one upsert per group, in group order (so concurrent harvesters cannot
  deadlock), adding only the newly inserted members to ``members`` and setting the
  verdict columns from the group's verdict unless it has one already: the first verdict
  is final, so a redelivered verdict changes nothing.

It returns the new member rows and the verdicts that found no verdict stored (as of the
statement's snapshot: two harvesters storing the same verdict at the same instant would
both count it, while the row stays right).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from coordinator.tracestore.profilesql import HAS_LINK, OBSERVED
from schemas.enums import GroupState
from schemas.models import GroupVerdict, MemberTrace

Row = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Staged:
    """The staging row of one stream entry: a member's trace or a group's verdict. Its
    last column is the entry's stream id."""

    verdict: bool
    row: Row

    @property
    def stream_id(self) -> str:
        return str(self.row[-1])


def trace_row(trace: MemberTrace, stream_id: str) -> Staged:
    """The staging row of one trace (column order of ``haco_harvest_stage``)."""
    t = trace
    return Staged(False, (
        t.member_id, t.group_id or t.invocation_id, t.candidate_id, t.role, t.zone,
        t.caller_zone, t.model, t.rank, t.u_plus, t.r_minus, t.started_at_s,
        t.finished_at_s, t.status.value, t.failure_kind.value if t.failure_kind else None,
        t.failure_reason, t.quality, t.latency_s, t.proc_latency_s, t.tokens_in,
        t.tokens_out, t.bytes_sent, t.rtt_s, t.bandwidth_Bps, t.lost, stream_id,
    ))  # fmt: skip


def verdict_row(v: GroupVerdict, stream_id: str) -> Staged:
    """The staging row of one verdict (column order of ``haco_harvest_verdicts``)."""
    return Staged(True, (
        v.group_id, v.role, v.state.value, v.winner_member, v.p_success, v.stop.value,
        v.launch_mode.value, v.winner_mode.value, v.started_at_s, v.decided_at_s,
        v.latency_s, v.planned, v.launched, v.succeeded, v.failed, v.timed_out,
        v.cancelled, v.running, v.backups,
        v.winner_rule.value if v.winner_rule else None, v.fallback_reason, stream_id,
    ))  # fmt: skip


_STAGE_DDL = """
CREATE TEMP TABLE IF NOT EXISTS haco_harvest_stage (
    member_id text, group_id text, candidate_id text, role text, zone text,
    caller_zone text, model text, rank integer, u_plus double precision,
    r_minus double precision, started_s double precision, finished_s double precision,
    status text, failure_kind text, failure_reason text, quality double precision,
    latency_s double precision, proc_latency_s double precision, tokens_in integer,
    tokens_out integer, bytes_sent bigint, rtt_s double precision,
    bandwidth_bps double precision, lost boolean, stream_id text
) ON COMMIT DELETE ROWS;
CREATE TEMP TABLE IF NOT EXISTS haco_harvest_verdicts (
    group_id text, role text, state text, winner_member text, p_success double precision,
    stop text, launch_mode text, winner_mode text, started_s double precision,
    decided_s double precision, latency_s double precision, planned integer,
    launched integer, succeeded integer, failed integer, timed_out integer,
    cancelled integer, running integer, backups integer, winner_rule text,
    fallback_reason text, stream_id text
) ON COMMIT DELETE ROWS
"""

_COPY_MEMBERS = "COPY haco_harvest_stage FROM STDIN"
_COPY_VERDICTS = "COPY haco_harvest_verdicts FROM STDIN"

# The verdict columns of invocations: set once, by the group's first verdict.
_VERDICT_COLS = (
    "state", "winner_member", "p_success", "stop", "launch_mode", "winner_mode",
    "latency_s", "decided_at", "planned", "launched", "succeeded", "failed", "timed_out",
    "cancelled", "running", "backups", "winner_rule", "fallback_reason",
)  # fmt: skip
_KEEP_FIRST = ",\n        ".join(
    f"{c} = CASE WHEN i.decided_at IS NULL THEN EXCLUDED.{c} ELSE i.{c} END" for c in _VERDICT_COLS
)

_MERGE = f"""
WITH ins AS (
    INSERT INTO members (member_id, group_id, candidate_id, role, zone, caller_zone, model,
        rank, u_plus, r_minus, started_at, finished_at, status, failure_kind,
        failure_reason, quality, latency_s, proc_latency_s, tokens_in, tokens_out,
        bytes_sent, rtt_s, bandwidth_bps, lost, stream_id)
    SELECT member_id, group_id, candidate_id, role, zone, caller_zone, model,
        rank, u_plus, r_minus, to_timestamp(started_s), to_timestamp(finished_s), status,
        failure_kind, failure_reason, quality, latency_s, proc_latency_s, tokens_in,
        tokens_out, bytes_sent, rtt_s, bandwidth_bps, lost, stream_id
    FROM haco_harvest_stage
    ON CONFLICT DO NOTHING
    RETURNING member_id, finished_at, group_id, role, started_at
), new_members AS (
    SELECT group_id, min(role) AS role, count(*) AS n, min(started_at) AS created_at
    FROM ins GROUP BY group_id
), verdicts AS (
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
), links AS (
    INSERT INTO link_observations (member_id, link_id, observed_at, bytes, lost,
        transfer_s, rtt_s, leg)
    SELECT b.member_id, b.caller_zone || '->' || b.zone, ins.finished_at, b.bytes_sent,
        b.lost, CASE WHEN b.bandwidth_bps > 0 THEN b.bytes_sent / b.bandwidth_bps END, b.rtt_s, 0
    FROM haco_harvest_stage b
    JOIN ins ON ins.member_id = b.member_id AND ins.finished_at = to_timestamp(b.finished_s)
    WHERE {HAS_LINK} AND {OBSERVED}
    ON CONFLICT DO NOTHING
)
SELECT (SELECT count(*) FROM ins), (SELECT count(*) FROM fresh)
"""


def write(cur: psycopg.Cursor[Any], rows: list[Staged]) -> tuple[int, int]:
    """Stage ``rows`` and merge them (in the caller's transaction); returns the member
    rows inserted and the verdicts stored."""
    cur.execute(_STAGE_DDL)
    for verdict, statement in ((False, _COPY_MEMBERS), (True, _COPY_VERDICTS)):
        batch = [s.row for s in rows if s.verdict is verdict]
        if batch:
            with cur.copy(statement) as copy:
                for row in batch:
                    copy.write_row(row)
    cur.execute(_MERGE.encode())
    got = cur.fetchone()
    return (int(got[0]), int(got[1])) if got else (0, 0)
