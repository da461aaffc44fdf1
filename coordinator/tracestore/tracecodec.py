"""Trace-stream entries into staging rows, fast: msgspec structs mirroring the JSON of
:class:`schemas.models.MemberReport` and :class:`schemas.models.GroupVerdict` (the wire
format stays the pydantic models').

The fast path accepts only what the pydantic models accept, with the same values, and
is stricter where that is cheaper (finite floats only, integers within the columns'
ranges, exact JSON types, no coercion). Whatever it rejects is parsed again with the
pydantic model: that decides, so the rare odd entry is stored or dead-lettered exactly
as before, with pydantic's message (:class:`pydantic.ValidationError` propagates).

A member row from the fast path is *checked*: its integers fit the ``members`` columns,
so a batch of them may be ``COPY``'d in binary straight into the table
(:func:`coordinator.tracestore.harvestsql.write_fresh`: a binary ``int4`` silently
keeps the low 32 bits of a bigger number, so unchecked rows never go that way).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec
from pydantic import ValidationError

from coordinator.errors import describe_validation_error
from coordinator.state import keys
from coordinator.tracestore.harvestsql import (
    PG_EPOCH_S,
    US_PER_S,
    FreshRows,
    Row,
    Staged,
    fresh_rows,
    trace_row,
    verdict_row,
)
from schemas.enums import FailureKind, GroupState, LaunchMode, MemberStatus, StopReason, WinnerMode
from schemas.models import GroupVerdict, MemberReport

_INT4_MAX = 2**31 - 1
_INT8_MAX = 2**63 - 1
_FLOAT_MAX = sys.float_info.max

# schemas.models.ZoneName, matched whole (pydantic's Rust ``$`` is the end of the text;
# Python's also matches before a final newline). Checked after decoding, against a
# memo of names seen valid: a deployment has a handful of zones, and a regex in the
# decoder (msgspec.Meta pattern) costs as much as the rest of the entry.
_ZONE = re.compile(r"[a-z][a-z0-9_-]{0,62}")
_ZONES_SEEN_MAX = 4096
_zones_seen: set[str] = set()
# Finite floats only: pydantic may accept an infinity where these allow one (a plain
# float), or refuse it (allow_inf_nan=False); either way the entry is left to it.
Finite = Annotated[float, msgspec.Meta(ge=-_FLOAT_MAX, le=_FLOAT_MAX)]
NonNegative = Annotated[float, msgspec.Meta(ge=0.0, le=_FLOAT_MAX)]
Probability = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
Int4 = Annotated[int, msgspec.Meta(ge=0, le=_INT4_MAX)]
Int8 = Annotated[int, msgspec.Meta(ge=0, le=_INT8_MAX)]


class _Trace(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    invocation_id: str
    member_id: str
    candidate_id: str
    role: str
    model: str
    zone: str
    caller_zone: str
    rank: Int4
    u_plus: Finite
    r_minus: Finite
    group_id: str = ""
    started_at_s: NonNegative
    finished_at_s: NonNegative
    status: MemberStatus
    failure_kind: FailureKind | None = None
    failure_reason: str | None = None
    success: bool
    quality: Probability | None = None
    latency_s: NonNegative
    proc_latency_s: NonNegative | None = None
    tokens_in: Int4 = 0
    tokens_out: Int4 = 0
    bytes_sent: Int8 = 0
    rtt_s: NonNegative | None = None
    bandwidth_Bps: NonNegative | None = None
    lost: bool = False


class _Report(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    trace: _Trace
    output: str | None = None


class _Verdict(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    group_id: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    role: Annotated[str, msgspec.Meta(min_length=1)]
    state: GroupState
    winner_member: str | None = None
    p_success: Probability
    stop: StopReason
    launch_mode: LaunchMode
    winner_mode: WinnerMode
    started_at_s: NonNegative
    decided_at_s: NonNegative
    latency_s: NonNegative
    planned: Int4
    launched: Int4
    succeeded: Int4 = 0
    failed: Int4 = 0
    timed_out: Int4 = 0
    cancelled: Int4 = 0
    running: Int4 = 0
    backups: Int4 = 0
    winner_rule: WinnerMode | None = None
    fallback_reason: Annotated[str, msgspec.Meta(max_length=500)] | None = None


_REPORTS = msgspec.json.Decoder(_Report)
_VERDICTS = msgspec.json.Decoder(_Verdict)
_SUCCEEDED = MemberStatus.SUCCEEDED


def _zone_ok(name: str) -> bool:
    if name in _zones_seen:
        return True
    if _ZONE.fullmatch(name) is None:
        return False
    if len(_zones_seen) < _ZONES_SEEN_MAX:
        _zones_seen.add(name)
    return True


def _consistent_trace(t: _Trace) -> bool:
    """The zone names and MemberTrace's model validator (the message of a failure comes
    from the pydantic re-parse)."""
    ok = t.status is _SUCCEEDED
    return (
        t.finished_at_s >= t.started_at_s
        and t.success == ok
        and (ok or t.failure_kind is not None)
        and _zone_ok(t.zone)
        and _zone_ok(t.caller_zone)
    )


def _consistent_verdict(v: _Verdict) -> bool:
    """GroupVerdict's model validator."""
    ended = v.succeeded + v.failed + v.timed_out + v.cancelled + v.running
    return (
        v.state.final
        and (v.winner_member is not None) == (v.state is GroupState.WON)
        and ended == v.launched <= v.planned
        and v.backups <= v.launched
        and v.decided_at_s >= v.started_at_s
    )


def _fast_report(raw: bytes | str, stream_id: str) -> Row | None:
    """The row of a MemberReport entry, or None: not one the fast path vouches for."""
    try:
        t = _REPORTS.decode(raw).trace
    except msgspec.DecodeError:  # ValidationError included
        return None
    if not _consistent_trace(t):
        return None
    fk = t.failure_kind
    return (
        t.member_id, t.group_id or t.invocation_id, t.candidate_id, t.role, t.zone,
        t.caller_zone, t.model, t.rank, t.u_plus, t.r_minus,
        round((t.started_at_s - PG_EPOCH_S) * US_PER_S),  # epoch_us, inline: once per column
        round((t.finished_at_s - PG_EPOCH_S) * US_PER_S), t.status.value,
        fk.value if fk is not None else None, t.failure_reason, t.quality, t.latency_s,
        t.proc_latency_s, t.tokens_in, t.tokens_out, t.bytes_sent, t.rtt_s,
        t.bandwidth_Bps, t.lost, stream_id,
    )  # fmt: skip


def _fast_verdict(raw: bytes | str, stream_id: str) -> Row | None:
    """The row of a GroupVerdict entry, or None: not one the fast path vouches for."""
    try:
        v = _VERDICTS.decode(raw)
    except msgspec.DecodeError:
        return None
    if not _consistent_verdict(v):
        return None
    rule = v.winner_rule
    return (
        v.group_id, v.role, v.state.value, v.winner_member, v.p_success, v.stop.value,
        v.launch_mode.value, v.winner_mode.value, v.started_at_s, v.decided_at_s,
        v.latency_s, v.planned, v.launched, v.succeeded, v.failed, v.timed_out,
        v.cancelled, v.running, v.backups, rule.value if rule is not None else None,
        v.fallback_reason, stream_id,
    )  # fmt: skip


def decode_report(raw: bytes | str, stream_id: str) -> tuple[Row, bool]:
    """The row of a MemberReport entry and whether the fast path checked it; raises
    pydantic's ValidationError."""
    row = _fast_report(raw, stream_id)
    if row is not None:
        return row, True
    return trace_row(MemberReport.model_validate_json(raw).trace, stream_id), False


def decode_verdict(raw: bytes | str, stream_id: str) -> tuple[Row, bool]:
    """The row of a GroupVerdict entry and whether the fast path checked it; raises
    pydantic's ValidationError."""
    row = _fast_verdict(raw, stream_id)
    if row is not None:
        return row, True
    return verdict_row(GroupVerdict.model_validate_json(raw), stream_id), False


@dataclass
class Batch:
    """One read of the stream, decoded: stream ids, staged rows (and each one's raw
    entry, for a dead letter), dead letters (id, raw, error), trimmed entries."""

    ids: list[str] = field(default_factory=list)
    rows: list[Staged] = field(default_factory=list)
    raw: dict[str, bytes | str] = field(default_factory=dict)
    dead: list[tuple[str, bytes | str, str]] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    # First delivered (XREADGROUP >: cannot be stored already) and every member row
    # checked: the batch may be copied straight in (harvestsql.write_fresh).
    fresh: bool = False
    fresh_rows: FreshRows | None = None  # set by parse_batch when ``fresh``


_REPORT_KEYS = (keys.REPORT_FIELD.encode(), keys.REPORT_FIELD)
_VERDICT_KEYS = (keys.VERDICT_FIELD.encode(), keys.VERDICT_FIELD)


def _payload(fields: Any) -> tuple[bytes | str, bool]:
    """An entry's report or verdict JSON, and whether it is a verdict. ``fields``: a
    dict (redis-py's reply) or the flat [name, value, ...] list of a raw reply."""
    if not isinstance(fields, dict):
        if len(fields) == 2 and fields[0] in _REPORT_KEYS:  # what workers append
            return fields[1], False
        fields = dict(zip(fields[::2], fields[1::2], strict=True))
    for name in _VERDICT_KEYS:
        if name in fields:
            return fields[name], True
    return next((fields[n] for n in _REPORT_KEYS if n in fields), b""), False


def parse_batch(entries: list[Any], fresh: bool) -> Batch:
    """Decode XREADGROUP/XAUTOCLAIM entries (id, fields) of the trace stream."""
    b = Batch(fresh=fresh)
    for entry_id, fields in entries:
        sid = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        b.ids.append(sid)
        if not fields:  # trimmed (MAXLEN) or deleted after we read it
            b.lost.append(sid)
            continue
        raw, verdict = _payload(fields)
        try:
            row, checked = decode_verdict(raw, sid) if verdict else decode_report(raw, sid)
        except ValidationError as exc:
            b.dead.append((sid, raw, describe_validation_error(exc, f"entry {sid}")))
            continue
        if not checked and not verdict:
            b.fresh = False
        b.rows.append((verdict, row))
        b.raw[sid] = raw
    if b.fresh and b.rows:  # here, not in the store thread, which Postgres keeps busy
        b.fresh_rows = fresh_rows(b.rows)
    return b
