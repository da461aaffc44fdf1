"""The harvester's fast decoder (coordinator/tracestore/tracecodec.py) against the pydantic
models it mirrors: every entry pydantic rejects is still dead-lettered, with pydantic's
message; every entry it accepts gives the row the pydantic path gives. The timestamps
agree with Postgres' ``to_timestamp`` (real Postgres)."""

from __future__ import annotations

import json
import random
from typing import Any

import psycopg
import pytest
from pydantic import ValidationError

from coordinator.errors import describe_validation_error
from coordinator.tracestore.harvestsql import epoch_us, trace_row, verdict_row
from coordinator.tracestore.tracecodec import parse_batch
from schemas.models import GroupVerdict, MemberReport


def trace(**changes: Any) -> dict[str, Any]:
    t: dict[str, Any] = {
        "invocation_id": "g1",
        "group_id": "g1",
        "member_id": "g1-m0",
        "candidate_id": "coder-us",
        "role": "coder",
        "model": "sim-model",
        "zone": "us",
        "caller_zone": "eu",
        "rank": 0,
        "u_plus": 0.5,
        "r_minus": 0.1,
        "started_at_s": 1_700_000_000.123456,
        "finished_at_s": 1_700_000_001.5,
        "status": "succeeded",
        "failure_kind": None,
        "failure_reason": None,
        "success": True,
        "quality": 0.8,
        "latency_s": 1.4,
        "proc_latency_s": 1.2,
        "tokens_in": 10,
        "tokens_out": 20,
        "bytes_sent": 300,
        "rtt_s": 0.05,
        "bandwidth_Bps": 1e6,
        "lost": False,
    }
    for k, v in changes.items():
        if v is _DROP:
            t.pop(k)
        else:
            t[k] = v
    return t


def verdict(**changes: Any) -> dict[str, Any]:
    v: dict[str, Any] = {
        "group_id": "g1",
        "role": "coder",
        "state": "won",
        "winner_member": "g1-m0",
        "p_success": 0.99,
        "stop": "target_reached",
        "launch_mode": "parallel",
        "winner_mode": "ranked",
        "started_at_s": 1_700_000_000.0,
        "decided_at_s": 1_700_000_002.0,
        "latency_s": 2.0,
        "planned": 3,
        "launched": 3,
        "succeeded": 2,
        "failed": 1,
        "backups": 1,
        "winner_rule": "ranked",
        "fallback_reason": None,
    }
    for k, val in changes.items():
        if val is _DROP:
            v.pop(k)
        else:
            v[k] = val
    return v


_DROP = object()


def report(output: Any = "ok", **changes: Any) -> str:
    return json.dumps({"trace": trace(**changes), "output": output})


FAILED = {"status": "failed", "success": False, "failure_kind": "internal", "quality": None}

# Every rule of MemberReport / MemberTrace (schemas/models.py) broken once.
BAD_REPORTS: dict[str, str] = {
    "not json": "{not json",
    "empty": "",
    "a list": "[]",
    "no trace": json.dumps({"output": "x"}),
    "extra top-level field": json.dumps({"trace": trace(), "output": "x", "extra": 1}),
    "extra trace field": report(colour="red"),
    "output not a string": report(output=5),
    "member_id missing": report(member_id=_DROP),
    "invocation_id missing": report(invocation_id=_DROP),
    "success missing": report(success=_DROP),
    "status missing": report(status=_DROP),
    "latency missing": report(latency_s=_DROP),
    "member_id a number": report(member_id=5),
    "status not in the enum": report(status="exploded"),
    "failure_kind not in the enum": report(**{**FAILED, "failure_kind": "meteor"}),
    "zone upper case": report(zone="US"),
    "zone empty": report(caller_zone=""),
    "zone with a final newline": report(zone="us\n"),
    "zone too long": report(zone="z" * 64),
    "rank negative": report(rank=-1),
    "rank fractional": report(rank=1.5),
    "rank a word": report(rank="first"),
    "tokens_in negative": report(tokens_in=-1),
    "tokens_out negative": report(tokens_out=-5),
    "bytes_sent negative": report(bytes_sent=-1),
    "latency negative": report(latency_s=-0.1),
    "latency infinite": report(latency_s=1e400),
    "proc_latency negative": report(proc_latency_s=-1.0),
    "started negative": report(started_at_s=-1.0),
    "rtt negative": report(rtt_s=-0.01),
    "bandwidth negative": report(bandwidth_Bps=-1.0),
    "quality above 1": report(quality=1.5),
    "quality below 0": report(quality=-0.1),
    "u_plus NaN": report().replace('"u_plus": 0.5', '"u_plus": NaN'),
    "finished before started": report(finished_at_s=1_699_999_999.0),
    "success contradicts status": report(success=False),
    "failed without failure_kind": report(**{**FAILED, "failure_kind": None}),
    "lost not a boolean": report(lost="maybe"),
    "lone surrogate": report().replace('"member_id": "g1-m0"', '"member_id": "a\\ud800"'),
}

BAD_VERDICTS: dict[str, str] = {
    "not json": "{",
    "extra field": json.dumps(verdict(colour="red")),
    "group_id empty": json.dumps(verdict(group_id="")),
    "group_id too long": json.dumps(verdict(group_id="g" * 65)),
    "role empty": json.dumps(verdict(role="")),
    "state missing": json.dumps(verdict(state=_DROP)),
    "state not final": json.dumps(verdict(state="running", winner_member=None)),
    "state not in the enum": json.dumps(verdict(state="lost")),
    "won without a winner": json.dumps(verdict(winner_member=None)),
    "a winner without won": json.dumps(verdict(state="all_failed")),
    "p_success above 1": json.dumps(verdict(p_success=1.01)),
    "stop not in the enum": json.dumps(verdict(stop="bored")),
    "launch_mode not in the enum": json.dumps(verdict(launch_mode="serial")),
    "winner_rule not in the enum": json.dumps(verdict(winner_rule="coin")),
    "planned negative": json.dumps(verdict(planned=-1)),
    "counts do not add up": json.dumps(verdict(failed=0)),
    "launched above planned": json.dumps(verdict(planned=2)),
    "backups above launched": json.dumps(verdict(backups=4)),
    "decided before started": json.dumps(verdict(decided_at_s=1_699_999_999.0)),
    "latency negative": json.dumps(verdict(latency_s=-1.0)),
    "fallback_reason too long": json.dumps(verdict(fallback_reason="x" * 501)),
}


def pydantic_error(model: type[MemberReport] | type[GroupVerdict], raw: bytes, sid: str) -> str:
    with pytest.raises(ValidationError) as info:  # the case breaks a rule pydantic enforces
        model.model_validate_json(raw)
    return describe_validation_error(info.value, f"entry {sid}")


@pytest.mark.parametrize("case", sorted(BAD_REPORTS))
def test_an_invalid_report_is_dead_lettered_with_pydantics_message(case: str) -> None:
    raw = BAD_REPORTS[case]
    batch = parse_batch([(b"1-0", [b"report", raw.encode()])], fresh=True)
    assert batch.rows == [] and len(batch.dead) == 1
    assert batch.dead[0] == ("1-0", raw.encode(), pydantic_error(MemberReport, raw.encode(), "1-0"))


@pytest.mark.parametrize("case", sorted(BAD_VERDICTS))
def test_an_invalid_verdict_is_dead_lettered_with_pydantics_message(case: str) -> None:
    raw = BAD_VERDICTS[case]
    batch = parse_batch([(b"1-0", {b"verdict": raw.encode()})], fresh=True)
    assert batch.rows == [] and len(batch.dead) == 1
    assert batch.dead[0] == ("1-0", raw.encode(), pydantic_error(GroupVerdict, raw.encode(), "1-0"))


VALID_REPORTS: dict[str, str] = {
    "plain": report(),
    "failed, lost": report(**{**FAILED, "failure_kind": "network"}, lost=True, rtt_s=None),
    "no group id": report(group_id=_DROP),
    "defaults": report(
        output=None, **{k: _DROP for k in ("tokens_in", "proc_latency_s", "rtt_s", "lost")}
    ),
    "unicode": report(member_id="g1-m\u00e9", failure_reason=None, model="m\u2013x"),
    "integral floats": report(latency_s=2, started_at_s=1_700_000_000, rank=0),
    "a key twice (the last one counts)": report().replace('"rank": 0', '"rank": 1, "rank": 2'),
    "negative zero": report(latency_s=-0.0, rtt_s=-0.0),
    # accepted by pydantic's lax mode only: the fast path leaves them to it
    "rank as 2.0": report(rank=2.0),
    "u_plus as a string": report(u_plus="0.25"),
    "lost as a string": report(lost="true"),
    "u_plus infinite": report(u_plus=1e400),
    "tokens past int4": report(tokens_in=2**40),
}


@pytest.mark.parametrize("case", sorted(VALID_REPORTS))
def test_a_valid_report_gives_the_pydantic_row(case: str) -> None:
    raw = VALID_REPORTS[case]
    batch = parse_batch([(b"7-1", [b"report", raw.encode()])], fresh=True)
    assert batch.dead == []
    expected = trace_row(MemberReport.model_validate_json(raw).trace, "7-1")
    assert batch.rows == [(False, expected)]
    assert batch.raw == {"7-1": raw.encode()}
    lax = case in ("rank as 2.0", "u_plus as a string", "lost as a string", "u_plus infinite")
    # only rows the fast path checked may be copied straight in (int4 columns)
    assert (batch.fresh_rows is not None) == (not lax and case != "tokens past int4")


def test_a_valid_verdict_gives_the_pydantic_row() -> None:
    for raw in (
        json.dumps(verdict()),
        json.dumps(verdict(state="deadline", winner_member=None, winner_rule=None)),
        json.dumps(verdict(fallback_reason="no judged output", winner_mode="best")),
    ):
        batch = parse_batch([("3-0", {"verdict": raw})], fresh=False)
        assert batch.rows == [(True, verdict_row(GroupVerdict.model_validate_json(raw), "3-0"))]


def test_trimmed_entries_are_lost_not_dead() -> None:
    batch = parse_batch([(b"1-0", None), (b"2-0", [b"report", report().encode()])], fresh=True)
    assert batch.lost == ["1-0"] and batch.ids == ["1-0", "2-0"] and len(batch.rows) == 1


def test_a_fresh_batch_derives_groups_like_the_merge() -> None:
    raws = [
        report(member_id="a", group_id="g1"),
        report(member_id="b", group_id="g1", started_at_s=1_699_999_999.0, bandwidth_Bps=0.0),
        report(member_id="c", group_id="g2", **{**FAILED, "failure_kind": "cancelled"}),  # no obs.
        report(member_id="d", group_id="g2", bytes_sent=0, rtt_s=None, lost=False),  # no link
    ]
    entries = [(f"{i}-0".encode(), [b"report", raw.encode()]) for i, raw in enumerate(raws)]
    fresh = parse_batch(entries, fresh=True).fresh_rows
    assert fresh is not None
    assert sorted(fresh.groups) == [
        ("g1", "coder", 2, epoch_us(1_699_999_999.0)),
        ("g2", "coder", 2, epoch_us(1_700_000_000.123456)),
    ]


def test_epoch_us_is_postgres_to_timestamp(pg_url: str) -> None:
    rng = random.Random(7)
    seconds = [rng.uniform(0, 4e9) for _ in range(5000)]
    seconds += [round(rng.uniform(1.6e9, 1.9e9), 6) + 5e-7 for _ in range(5000)]  # ties
    seconds += [0.0, 1e-6, 5e-7, 946_684_800.0000005, 1_700_000_000.1234565]
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(
            "SELECT to_timestamp(s) - timestamptz '2000-01-01 00:00:00+00' FROM unnest(%s) s",
            [seconds],
        ).fetchall()
    for s, (delta,) in zip(seconds, rows, strict=True):
        us = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
        assert epoch_us(s) == us, s
