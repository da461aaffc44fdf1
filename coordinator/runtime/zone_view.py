"""The zones of a pool as an operator sees them (`haco zones`, the dashboard of
`haco serve`): per zone, its queue's depth, the workers that consume it, the members in
flight, recent member latency, the share of recent wins, the last failure, and the
restarts of its supervised worker.

Where each figure comes from:

- **queued**: ``LLEN haco.zone.<zone>`` on the broker database (with kombu's priority
  lists ``<queue>\\x06\\x16<n>``, empty unless a priority was set).
- **workers**: Celery's ``active_queues`` broadcast: the online workers whose consumers
  include the zone's queue, or its lane queue (a worker running members in its member
  lane, workers/lane.py). A zone no online worker consumes is **missing** — its members
  wait in the queue until their deadline. (Flower lists only the queues some online worker
  consumes, so it cannot show this.)
- **in flight**: Celery's ``active`` broadcast: tasks running on those workers (member
  lanes list theirs too), counted by the queue they came from
  (``delivery_info.routing_key``).
- **members, p50/p95, failures, last failure, win share**: the recent member reports and
  group verdicts — the trace stream (``keys.TRACES``: what the harvester has not taken yet)
  merged with the trace store's ``members``/``invocations`` of the last ``window_s``
  seconds when one is configured and reachable (the harvester deletes stream entries once
  stored). Win share: of the recent groups that won, the fraction whose winner ran here.
- **restarts**: ``<state_dir>/supervisor.json`` when it exists (written by the supervisor
  of `haco up`): the restarts of the process named ``worker-<zone>`` (or ``<zone>``).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import redis

from coordinator.errors import HacoError
from coordinator.state import keys
from coordinator.state.codec import text
from coordinator.state.keys import lane_queue, queue_for
from coordinator.tracestore.db import connect

STREAM_SCAN = 5000  # newest trace-stream entries read
DB_LIMIT = 5000  # newest member rows read from the trace store
SUPERVISOR_FILE = "supervisor.json"


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """One executed member, from the trace stream or the trace store."""

    member_id: str
    group_id: str
    candidate: str
    zone: str
    status: str
    latency_s: float
    finished_at_s: float
    failure_kind: str | None = None
    failure_reason: str | None = None


@dataclass
class Recent:
    """Recent members (by member id) and the winners of recent groups."""

    members: dict[str, MemberRecord] = field(default_factory=dict)
    winners: dict[str, float] = field(default_factory=dict)  # member id -> decided at
    sources: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def win_zones(self) -> list[tuple[float, str]]:
        """(decided at, zone) of each recent win whose winner's report is known."""
        out = []
        for member_id, at in self.winners.items():
            m = self.members.get(member_id)
            if m is not None:
                out.append((at, m.zone))
        return sorted(out)


@dataclass
class ZoneRow:
    zone: str
    queue: str
    status: str  # "ok" | "missing"
    workers: list[str]
    queued: int | None
    in_flight: int | None
    members: int
    failures: int
    latency_p50_s: float | None
    latency_p95_s: float | None
    wins: int
    win_share: float | None
    last_failure: dict[str, Any] | None
    restarts: int | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[min(rank, len(ordered)) - 1])


# -- the broker


def queue_depths(broker: redis.Redis, zones: Iterable[str]) -> dict[str, int]:
    """Messages waiting in each zone's queue (LLEN, priority lists included)."""
    zones = list(zones)
    pipe = broker.pipeline(transaction=False)
    for z in zones:
        for name in keys.priority_lists(queue_for(z)):
            pipe.llen(name)
    counts = pipe.execute()
    per = len(keys.PRIORITY_STEPS)
    return {z: int(sum(counts[i * per : (i + 1) * per])) for i, z in enumerate(zones)}


@dataclass
class WorkerView:
    """Online workers, the queues each consumes, the tasks each runs."""

    queues: dict[str, list[str]] = field(default_factory=dict)
    active: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    problem: str | None = None

    def consumers(self, *queues: str) -> list[str]:
        """The workers that consume any of ``queues`` (a zone's queue, its lane queue)."""
        return sorted(w for w, qs in self.queues.items() if set(queues) & set(qs))

    def running(self, queue: str) -> int:
        n = 0
        for worker, tasks in self.active.items():
            for t in tasks or []:
                routed = (t.get("delivery_info") or {}).get("routing_key")
                if routed == queue or (routed is None and queue in self.queues.get(worker, [])):
                    n += 1
        return n


def inspect_workers(app: Any, timeout_s: float) -> WorkerView:
    """Celery's ``active_queues`` and ``active`` broadcasts (each waits ``timeout_s``)."""
    view = WorkerView()
    try:
        inspect = app.control.inspect(timeout=timeout_s)
        replies: dict[str, Any] = inspect.active_queues() or {}
        view.queues = {
            w: [str(q.get("name")) for q in (qs or []) if isinstance(q, dict)]
            for w, qs in replies.items()
        }
        view.active = dict(inspect.active() or {})
    except Exception as exc:  # a broker failure is reported, not raised
        view.problem = f"workers: cannot inspect: {exc}"
    return view


# -- recent members


def _member_from_report(raw: Mapping[str, Any]) -> MemberRecord | None:
    t = raw.get("trace")
    if not isinstance(t, dict):
        return None
    try:
        return MemberRecord(
            member_id=str(t["member_id"]),
            group_id=str(t.get("group_id") or t.get("invocation_id") or ""),
            candidate=str(t["candidate_id"]),
            zone=str(t["zone"]),
            status=str(t["status"]),
            latency_s=float(t["latency_s"]),
            finished_at_s=float(t["finished_at_s"]),
            failure_kind=t.get("failure_kind"),
            failure_reason=t.get("failure_reason"),
        )
    except (KeyError, TypeError, ValueError):
        return None


def read_stream(client: redis.Redis, recent: Recent, since_s: float, count: int) -> None:
    """The newest ``count`` trace-stream entries (member reports, group verdicts)."""
    entries = client.xrevrange(keys.TRACES, count=count) or []
    for _id, fields in entries:
        for k, v in (fields or {}).items():
            name = text(k)
            try:
                raw = json.loads(v)
            except (TypeError, ValueError):
                continue
            if name == keys.REPORT_FIELD:
                m = _member_from_report(raw)
                if m is not None and m.finished_at_s >= since_s:
                    recent.members.setdefault(m.member_id, m)
            elif name == keys.VERDICT_FIELD and isinstance(raw, dict):
                winner = raw.get("winner_member")
                at = float(raw.get("decided_at_s") or 0.0)
                if winner and at >= since_s:
                    recent.winners.setdefault(str(winner), at)
    recent.sources.append("trace stream")


_DB_MEMBERS = """
SELECT m.member_id, m.group_id, m.candidate_id, m.zone, m.status, m.latency_s,
       extract(epoch FROM m.finished_at), m.failure_kind, m.failure_reason,
       i.winner_member = m.member_id, extract(epoch FROM coalesce(i.decided_at, m.finished_at))
FROM members m LEFT JOIN invocations i ON i.group_id = m.group_id
WHERE m.finished_at >= to_timestamp(%s)
ORDER BY m.finished_at DESC LIMIT %s
"""


def read_trace_store(url: str, recent: Recent, since_s: float, limit: int) -> None:
    """The trace store's members of the window, and which of them won."""
    try:
        with connect(url, timeout_s=2) as conn:
            rows = conn.execute(_DB_MEMBERS, (since_s, limit)).fetchall()
    except (HacoError, psycopg.Error) as exc:
        recent.problems.append(f"trace store: {' '.join(str(exc).split())}")
        return
    for row in rows:
        m = MemberRecord(
            member_id=row[0], group_id=row[1], candidate=row[2], zone=row[3], status=row[4],
            latency_s=float(row[5]), finished_at_s=float(row[6]), failure_kind=row[7],
            failure_reason=row[8],
        )  # fmt: skip
        recent.members.setdefault(m.member_id, m)
        if row[9]:
            recent.winners.setdefault(m.member_id, float(row[10]))
    recent.sources.append("trace store")


def read_recent(
    client: redis.Redis, database_url: str | None, window_s: float, now_s: float | None = None
) -> Recent:
    """Members and wins of the last ``window_s`` seconds: the trace stream, and the trace
    store when ``database_url`` is given (a failure there is a problem, not an error)."""
    since = (time.time() if now_s is None else now_s) - window_s
    recent = Recent()
    try:
        read_stream(client, recent, since, STREAM_SCAN)
    except redis.RedisError as exc:
        recent.problems.append(f"trace stream: {exc}")
    if database_url:
        read_trace_store(database_url, recent, since, DB_LIMIT)
    return recent


# -- supervision


def supervisor_restarts(state_dir: Path) -> dict[str, int] | None:
    """Restarts by process name from ``<state_dir>/supervisor.json``; None without it.
    Accepts ``{"processes": [...]}``, a list of processes, or ``{name: {...}}``."""
    path = state_dir / SUPERVISOR_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    procs: list[Any]
    if isinstance(data, dict) and isinstance(data.get("processes"), list | dict):
        data = data["processes"]
    if isinstance(data, dict):
        procs = [{"name": k, **v} for k, v in data.items() if isinstance(v, dict)]
    elif isinstance(data, list):
        procs = data
    else:
        return None
    out: dict[str, int] = {}
    for p in procs:
        if isinstance(p, dict) and "name" in p:
            with contextlib.suppress(TypeError, ValueError):
                out[str(p["name"])] = out.get(str(p["name"]), 0) + int(p.get("restarts") or 0)
    return out


def _zone_restarts(restarts: Mapping[str, int] | None, zone: str) -> int | None:
    if restarts is None:
        return None
    names = (f"worker-{zone}", f"worker:{zone}", f"haco-{zone}", zone)
    found = [restarts[n] for n in names if n in restarts]
    return sum(found) if found else 0


# -- the rows


def zone_rows(
    zones: Sequence[str],
    depths: Mapping[str, int] | None,
    workers: WorkerView,
    recent: Recent,
    restarts: Mapping[str, int] | None,
) -> list[ZoneRow]:
    by_zone: dict[str, list[MemberRecord]] = {z: [] for z in zones}
    for m in recent.members.values():
        by_zone.setdefault(m.zone, []).append(m)
    wins = recent.win_zones()
    total_wins = len(wins)
    rows = []
    for z in zones:
        q = queue_for(z)
        ms = by_zone.get(z, [])
        lat = [m.latency_s for m in ms if m.status == "succeeded"]
        failed = sorted(
            (m for m in ms if m.status in ("failed", "timed_out")), key=lambda m: m.finished_at_s
        )
        last = failed[-1] if failed else None
        consumers = workers.consumers(q, lane_queue(z))
        n_wins = sum(1 for _at, wz in wins if wz == z)
        inspected = workers.problem is None
        rows.append(
            ZoneRow(
                zone=z, queue=q,
                status="ok" if consumers else ("missing" if inspected else "unknown"),
                workers=consumers,
                queued=None if depths is None else depths.get(z, 0),
                in_flight=workers.running(q) if inspected else None,
                members=len(ms), failures=len(failed),
                latency_p50_s=percentile(lat, 50), latency_p95_s=percentile(lat, 95),
                wins=n_wins, win_share=(n_wins / total_wins) if total_wins else None,
                last_failure=None if last is None else {
                    "at_s": last.finished_at_s, "candidate": last.candidate,
                    "status": last.status, "kind": last.failure_kind,
                    "reason": last.failure_reason,
                },
                restarts=_zone_restarts(restarts, z),
            )
        )  # fmt: skip
    return rows


def share_series(
    recent: Recent, zones: Sequence[str], now_s: float, bin_s: float, bins: int
) -> list[dict[str, Any]]:
    """Wins per zone in each of the last ``bins`` bins of ``bin_s`` seconds, oldest first:
    ``{"t": bin end (epoch s), "wins": {zone: n}}``."""
    start = now_s - bin_s * bins
    counts: list[dict[str, int]] = [dict.fromkeys(zones, 0) for _ in range(bins)]
    for at, zone in recent.win_zones():
        i = int((at - start) // bin_s)
        if 0 <= i < bins:
            counts[i][zone] = counts[i].get(zone, 0) + 1
    return [{"t": start + bin_s * (i + 1), "wins": c} for i, c in enumerate(counts)]
