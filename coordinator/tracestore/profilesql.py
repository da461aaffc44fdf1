"""The recompute's aggregation: experience profiles from the trace store, in SQL.

:func:`aggregate` builds, for the members up to a stream-id watermark that finished in a
window, the candidate and link profiles that folding their observations in stream order
(:func:`coordinator.core.profiles.update_candidate` / ``update_link``) gives — the reading of
a row is :func:`coordinator.core.observations.observations`, which the SQL below implements
with fragments built from that module's constants (:data:`OBSERVED`, :data:`OK`,
:data:`DELIVERED`, :data:`HAS_LINK`; migration 0006's ``link_observations`` view states
the same link condition).

- Without decay (the default) one parallel scan groups by (candidate, caller zone, zone)
  with plain counts and sums; Python adds the groups up per candidate and per link.
- With a half-life every row gets the weight it has in the fold's final profile
  (:func:`coordinator.core.decay_batch.fold_weights`: by observations ``0.5^(later
  observations / h)``, by seconds ``0.5^(Σ later max(0, Δt) / h)``, the product of the
  fold's per-step factors), which needs each candidate's and link's rows in stream
  order: the same rows, read the same way, are packed per group by a parallel scan and
  weighted in numpy (:mod:`coordinator.tracestore.profilepacked`).
- The recent-latency window and ``last_seen_s`` come from the newest rows of each
  candidate by finish time (an index scan of ``members_candidate_finished``), ordered by
  stream id: exactly the fold's unless a trace reached the stream more than
  ``SLACK`` traces of its candidate after it finished.
- Link profiles are read from the members' link columns (the ``link_observations`` view
  shows them as one observation per member, leg 0). Each row is one trial for the loss
  rate (a call is lost or not: ``LinkObservation.can_be_lost``).
- The recent-bandwidth window of each link (``LinkProfile.recent_bandwidth_Bps``) comes
  from its newest rows with a bandwidth by finish time (an index scan of the partial
  index ``members_link_finished``, migration 0006), ordered by stream id, like the
  latency window: exactly the fold's unless a trace reached the stream more than
  ``LINK_SLACK`` traces of its link after it finished (and then a few of the newest
  values differ, which moves a median little).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import psycopg

from coordinator.core.observations import (
    CALL_SUCCEEDED,
    LOST_UNLESS_MEASURED,
    NOT_OBSERVED,
    SERVICE_FAILURES,
)
from coordinator.core.params import ProfileSettings
from coordinator.core.profiles import (
    PRIOR_ALPHA,
    PRIOR_BETA,
    CandidateProfile,
    LinkProfile,
    Moments,
)
from coordinator.tracestore.profilepacked import (
    BATCH_ROWS,
    CAND_FLAGS,
    CAND_VALUES,
    FLAGS,
    LINK_VALUES,
    fields,
    packed_sums,
)
from schemas.enums import FailureKind

SLACK = 64  # newest rows by finish time scanned beyond the latency window
# ... and beyond a link's bandwidth window: a link carries the traces of all the
# candidates of its zone, so its rows arrive out of order by more of them.
LINK_SLACK = 256
Conn = psycopg.Connection[Any]


def _kinds(kinds: frozenset[FailureKind]) -> str:
    return ", ".join(f"'{k.value}'" for k in sorted(kinds))


# coordinator.core.observations.observations over a row of members, in SQL.
OBSERVED = f"(failure_kind IS NULL OR failure_kind NOT IN ({_kinds(NOT_OBSERVED)}))"
OK = f"(failure_kind IS NULL OR failure_kind IN ({_kinds(CALL_SUCCEEDED)}))"
DELIVERED = f"(failure_kind IS DISTINCT FROM '{LOST_UNLESS_MEASURED.value}' OR rtt_s IS NOT NULL)"
HAS_LINK = "(bytes_sent > 0 OR lost OR rtt_s IS NOT NULL)"  # observations.records_link

# Members that are observations, up to the watermark, in the window.
_FILTER = f"""finished_at >= %(since)s
    AND {OBSERVED}
    AND (split_part(stream_id, '-', 1)::bigint, split_part(stream_id, '-', 2)::bigint)
        <= (%(w_ms)s, %(w_seq)s)"""

_ROWS = f"""
SELECT candidate_id AS pid, caller_zone AS src, zone AS dst, ok, failure_kind,
    split_part(stream_id, '-', 1)::bigint AS ms, split_part(stream_id, '-', 2)::bigint AS seq,
    date_part('epoch', finished_at) AS at,
    {DELIVERED} AS delivered,
    CASE WHEN ok AND (judged_at IS NULL OR judged_at <= %(sealed_at)s) THEN quality END AS q,
    CASE WHEN ok THEN proc_latency_s END AS lat,
    tokens_in::float8 AS tin, CASE WHEN ok THEN tokens_out::float8 END AS tout,
    {HAS_LINK} AS has_link, lost,
    CASE WHEN NOT lost AND bandwidth_bps > 0 AND bytes_sent > 0
        THEN bytes_sent / (bytes_sent / bandwidth_bps) END AS bw,
    CASE WHEN NOT lost THEN rtt_s END AS rtt
FROM (SELECT *, {OK} AS ok FROM members WHERE {_FILTER}) m
"""


def _agg(expr: str | None, cond: str | None) -> str:
    """The count of rows where ``cond``, or of non-null ``expr`` with Σx, Σx²."""
    if expr is None:
        return f"count(*) FILTER (WHERE {cond})" if cond else "count(*)"
    return f"count({expr}), sum({expr}), sum({expr} * {expr})"


# Profile counts: internal (every service failure, observations.profiled_failure),
# network, deadline; by the names of coordinator.tracestore.profilepacked.
_FAILED = {
    name: f"NOT ok AND failure_kind IN ({_kinds(kinds)})"
    for name, kinds in (("internal", SERVICE_FAILURES),
                        ("network", frozenset({FailureKind.NETWORK})),
                        ("deadline", frozenset({FailureKind.DEADLINE})))
}  # fmt: skip
_FLAG_SQL = {"delivered": "delivered", "ok": "ok", **_FAILED, "has_link": "has_link",
             "lost": "lost"}  # fmt: skip


def _cand_cols() -> str:
    counts = [_agg(None, None)] + [_agg(None, _FLAG_SQL[c]) for c in CAND_FLAGS]
    return ", ".join(counts + [_agg(x, None) for x in CAND_VALUES])


def _link_cols() -> str:
    counts = [_agg(None, "has_link"), _agg(None, "has_link AND lost")]
    moments = [_agg(f"CASE WHEN has_link THEN {x} END", None) for x in LINK_VALUES]
    return ", ".join(counts + moments)


N_CAND = 18  # aggregate columns of a candidate (then a link's 8)

# Without decay: one parallel scan, grouped; rows: pid, src, dst, the candidate's
# aggregates, the link's, then the unweighted counts.
_GROUPED = f"""SELECT pid, src, dst, {_cand_cols()}, {_link_cols()},
    count(*), count(*) FILTER (WHERE has_link)
FROM ({_ROWS}) r GROUP BY pid, src, dst"""


# A packed group holds one hour of stream ids, so that profilepacked can fold whole hours
# a batch at a time. A bytea cannot pass 1 GB, which an hour of one candidate and link's
# 74-byte records reaches only at 4 000 observations a second.
_HOUR_MS = 3_600_000


def _packed(settings: ProfileSettings) -> bytes:
    """With decay: each group's rows packed (coordinator.tracestore.profilepacked), the
    groups in order of the stream id's hour."""
    bits = " | ".join(f"(coalesce({_FLAG_SQL[f]}, false)::int << {i})" for i, f in enumerate(FLAGS))
    send = {"ms": "int8send(ms)", "seq": "int8send(seq)", "at": "float8send(at)",
            "bits": f"int2send(({bits})::int2)"}  # fmt: skip
    record = " || ".join(send.get(f, f"float8send(coalesce({f}, 'NaN'))") for f in fields(settings))
    # OFFSET 0 keeps the subquery whole, so that the parallel workers pack the rows
    # (string_agg has no parallel step in Postgres 15; the leader only appends them).
    query = f"""SELECT pid, src, dst, hour, string_agg(rec, ''::bytea) FROM (
    SELECT pid, src, dst, ms / {_HOUR_MS} AS hour, {record} AS rec FROM ({_ROWS}) r OFFSET 0
) packed GROUP BY pid, src, dst, hour ORDER BY hour"""
    return query.encode()


# Per candidate, its newest rows by finish time (index scan): the latency window, and the
# rows (with their link) among which the last in stream order is found, in arrays: one
# row per candidate. A row per newest trace carried the window in each (SLACK times):
# with 200 candidates, 3.3M values to decode, 0.5 s and 120 MB of a recompute.
_NEWEST = f"""
SELECT c.pid, lat.lats, last.src, last.dst, last.has_link, last.ms, last.seq, last.at
FROM unnest(%(pids)s::text[]) AS c(pid)
CROSS JOIN LATERAL (
    SELECT array_agg(lat ORDER BY ms, seq) AS lats FROM (
        SELECT * FROM (
            SELECT proc_latency_s AS lat, split_part(stream_id, '-', 1)::bigint AS ms,
                split_part(stream_id, '-', 2)::bigint AS seq
            FROM members
            WHERE candidate_id = c.pid AND {_FILTER} AND proc_latency_s IS NOT NULL
                AND {OK}
            ORDER BY finished_at DESC LIMIT %(scan)s
        ) newest ORDER BY ms DESC, seq DESC LIMIT %(latency_window)s
    ) kept
) lat
CROSS JOIN LATERAL (
    SELECT array_agg(src) AS src, array_agg(dst) AS dst, array_agg(has_link) AS has_link,
        array_agg(ms) AS ms, array_agg(seq) AS seq, array_agg(at) AS at
    FROM (
        SELECT caller_zone AS src, zone AS dst, {HAS_LINK} AS has_link,
            split_part(stream_id, '-', 1)::bigint AS ms,
            split_part(stream_id, '-', 2)::bigint AS seq, date_part('epoch', finished_at) AS at
        FROM members WHERE candidate_id = c.pid AND {_FILTER}
        ORDER BY finished_at DESC LIMIT {SLACK}
    ) newest
) last
"""


# Per link, its newest delivered bandwidth observations by finish time: the recent-bandwidth
# window, the same value and condition as ``bw`` in _ROWS (observations: bytes / (bytes /
# bandwidth)). The three conditions on lost, bandwidth and bytes are the predicate of the
# partial index members_link_finished (migrations/0006): stated here as there, so the
# planner can scan it by link, newest first.
_NEWEST_BW = f"""
SELECT l.src, l.dst, kept.bws
FROM unnest(%(srcs)s::text[], %(dsts)s::text[]) AS l(src, dst)
CROSS JOIN LATERAL (
    SELECT array_agg(bw ORDER BY ms, seq) AS bws FROM (
        SELECT * FROM (
            SELECT bytes_sent / (bytes_sent / bandwidth_bps) AS bw,
                split_part(stream_id, '-', 1)::bigint AS ms,
                split_part(stream_id, '-', 2)::bigint AS seq
            FROM members
            WHERE caller_zone = l.src AND zone = l.dst AND {_FILTER}
                AND NOT lost AND bandwidth_bps > 0 AND bytes_sent > 0
            ORDER BY finished_at DESC LIMIT %(bw_scan)s
        ) newest ORDER BY ms DESC, seq DESC LIMIT %(bandwidth_window)s
    ) kept
) kept
"""


def _m(values: Sequence[Any]) -> Moments:
    n, s1, s2 = (float(v or 0.0) for v in values)
    return Moments(n, s1, s2)


def _add(acc: list[float] | None, values: Sequence[Any]) -> list[float]:
    vals = [float(v or 0.0) for v in values]
    return vals if acc is None else [a + v for a, v in zip(acc, vals, strict=True)]


def _candidate(
    pid: str, v: list[float], n: int, recent: tuple[float, ...], last: float | None
) -> CandidateProfile:
    q = _m(v[6:9])
    return CandidateProfile(
        candidate_id=pid, alpha=PRIOR_ALPHA + q.s1, beta=PRIOR_BETA + (q.n - q.s1),
        calls=v[0], delivered=v[1], successes=v[2], internal_failures=v[3],
        network_failures=v[4], deadline_failures=v[5], quality=q, latency=_m(v[9:12]),
        tokens_in=_m(v[12:15]), tokens_out=_m(v[15:18]), recent_latency_s=recent,
        observations=n, last_seen_s=last,
    )  # fmt: skip


def _link(
    src: str, dst: str, v: list[float], n: int, recent: tuple[float, ...], last: float | None
) -> LinkProfile:
    return LinkProfile(
        src=src, dst=dst, transmissions=v[0], losses=v[1], bandwidth=_m(v[2:5]),
        rtt=_m(v[5:8]), recent_bandwidth_Bps=recent, observations=n, last_seen_s=last,
    )  # fmt: skip


class _Sums:
    """Aggregates of the query rows added up per candidate and per link."""

    def __init__(self) -> None:
        self.cand: dict[str, list[float]] = {}
        self.cand_n: dict[str, int] = defaultdict(int)
        self.link: dict[tuple[str, str], list[float]] = {}
        self.link_n: dict[tuple[str, str], int] = defaultdict(int)

    def add(self, row: tuple[Any, ...]) -> None:
        """A row of the grouped query (no decay)."""
        pid, src, dst, values = row[0], row[1], row[2], row[3:]
        cand, link, n_cand, n_link = values[:N_CAND], values[N_CAND:-2], values[-2], values[-1]
        if n_cand:
            self.cand[pid] = _add(self.cand.get(pid), cand)
            self.cand_n[pid] += int(n_cand)
        if n_link:
            self.link[(src, dst)] = _add(self.link.get((src, dst)), link)
            self.link_n[(src, dst)] += int(n_link)

    def add_packed(
        self, rows: Iterable[tuple[Any, ...]], settings: ProfileSettings, batch_rows: int
    ) -> None:
        """The rows of the packed query (with decay), weighted."""
        cands, links = packed_sums(rows, settings, batch_rows)
        for pid, (v, n) in cands.items():
            self.cand[pid], self.cand_n[pid] = v, n
        for link, (v, n) in links.items():
            self.link[link], self.link_n[link] = v, n


def _last(traces: Iterable[tuple[Any, ...]]) -> dict[Any, float]:
    """Per key, the finish time of its last trace in stream order, from ``(key, ms, seq,
    at)``; a key of None is skipped."""
    best: dict[Any, tuple[int, int, float]] = {}
    for k, ms, seq, at in traces:
        if k is None:
            continue
        cur = (int(ms), int(seq), float(at))
        if k not in best or cur[:2] > best[k][:2]:
            best[k] = cur
    return {k: v[2] for k, v in best.items()}


def split_id(stream_id: str) -> tuple[int, int]:
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


def aggregate(
    conn: Conn,
    watermark: str,
    since: datetime,
    sealed_at: datetime,
    settings: ProfileSettings,
    batch_rows: int = BATCH_ROWS,
) -> tuple[dict[str, CandidateProfile], dict[str, LinkProfile]]:
    """Candidate and link profiles of the members up to ``watermark`` that finished since
    ``since``, on one snapshot of the database (REPEATABLE READ). Judgements made after
    ``sealed_at`` are left to the online deltas. ``conn`` must be in autocommit mode.
    With decay, the rows are weighted ``batch_rows`` or more at a time (profilepacked)."""
    w_ms, w_seq = split_id(watermark)
    params: dict[str, Any] = {
        "since": since, "sealed_at": sealed_at, "w_ms": w_ms, "w_seq": w_seq,
        "latency_window": settings.latency_window,
        "scan": settings.latency_window + SLACK,
        "bandwidth_window": settings.bandwidth_window,
        "bw_scan": settings.bandwidth_window + LINK_SLACK,
    }  # fmt: skip
    sums = _Sums()
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        conn.execute("SET LOCAL jit = off")  # compiling costs more than it saves here
        conn.execute("SET LOCAL work_mem = '256MB'")
        if math.isinf(settings.half_life):
            for row in conn.execute(_GROUPED.encode(), params).fetchall():
                sums.add(row)
        else:  # bytea in binary (no hex text to decode), a group at a time
            with conn.cursor() as cur:
                groups = cur.stream(_packed(settings), params, binary=True)
                sums.add_packed(groups, settings, batch_rows)
        params["pids"] = sorted(sums.cand)
        newest = conn.execute(_NEWEST.encode(), params).fetchall() if sums.cand else []
        links = sorted(sums.link)
        params["srcs"], params["dsts"] = [s for s, _ in links], [d for _, d in links]
        newest_bw = conn.execute(_NEWEST_BW.encode(), params).fetchall() if links else []
    return _profiles(sums, newest, newest_bw)


def _profiles(
    sums: _Sums, newest: list[tuple[Any, ...]], newest_bw: list[tuple[Any, ...]]
) -> tuple[dict[str, CandidateProfile], dict[str, LinkProfile]]:
    recent = {row[0]: tuple(float(x) for x in row[1] or ()) for row in newest}
    recent_bw = {(row[0], row[1]): tuple(float(x) for x in row[2] or ()) for row in newest_bw}
    # The newest traces, one tuple each: (pid, src, dst, has_link, ms, seq, at).
    traces = [(pid, *t) for pid, _, *cols in newest
              for t in zip(*(c or () for c in cols), strict=True)]  # fmt: skip
    last_c = _last((t[0], *t[4:]) for t in traces)
    last_l = _last(((t[1], t[2]) if t[3] else None, *t[4:]) for t in traces)
    cands = {
        pid: _candidate(pid, v, sums.cand_n[pid],
                        recent.get(pid, ()), last_c.get(pid))
        for pid, v in sums.cand.items()
    }  # fmt: skip
    links = {
        f"{src}->{dst}": _link(src, dst, v, sums.link_n[(src, dst)],
                               recent_bw.get((src, dst), ()), last_l.get((src, dst)))
        for (src, dst), v in sums.link.items()
    }  # fmt: skip
    return cands, links
