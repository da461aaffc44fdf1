"""A member's writes on the worker's hot path: its start, its report, its harvest.

- :meth:`RedisMemberOps.start_member` (``start_claim.lua`` + ``member_start.lua``): the
  group's signal, the start claim and the started token. An idle member lane makes the
  same start in the round trip that records the member's message (``lane_start.lua``,
  :func:`start_call`).
- :meth:`RedisMemberOps.report_member`: ``member_report.lua``, the reply (with a staged
  close, coordinator.state.closing) and the outcome claim; then, when the outcome is this
  worker's, ``member_harvest.lua`` (with ``profile_fold.lua``): the profile fold into the
  current epoch's deltas, the trace and the hedge-delay sample, atomically, and the
  message's ack. Two round trips, so that the caller's reply is written before the fold
  and the sample run (Redis answers a blocked caller only after every command of the
  same turn). The fold runs in the script, so concurrent workers never retry or queue
  on a lock.

The in-memory twin is :class:`coordinator.state.memstore.MemoryStore`'s methods of the
same names. Key names: :mod:`coordinator.state.keys` (``idempotency`` holds the start
and outcome claims, ``delta_candidate`` / ``delta_link`` the deltas); the scripts build
the delta names from ``keys.DELTA_PREFIX`` (one server, as :mod:`coordinator.state.epochs`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

import redis

from coordinator.core.params import DecayUnit, ProfileSettings
from coordinator.core.profiles import CandidateObservation, LinkObservation
from coordinator.state import keys
from coordinator.state.closing import GroupClose
from coordinator.state.codec import text
from coordinator.state.hedgedelay import window_entry
from coordinator.state.lean import lean_for
from coordinator.state.lua import script
from coordinator.state.scriptacks import SCRIPT_ACKS
from schemas.enums import GroupSignal

_MS = 1000
P = TypeVar("P")


class Started(Enum):
    """What a member's start found (workers.member acts on it)."""

    RUN = 1  # claimed: the member runs
    NOT_STARTED = 0  # its group is gone or cancelled, or its deadline passed
    DECLARED_LOST = 2  # its coordinator declared it not started in time


@dataclass(frozen=True, slots=True)
class MemberStart:
    group_id: str
    start_claim: str  # the claim's key (coordinator.runtime.liveness.start_key)
    started_token: str  # pushed on the group's reply list when it starts ('': not now)
    owner: str  # the claimant's token (liveness.WORKER)
    past_deadline: bool  # the deadline passed before the start: do not start
    ttl_s: float  # the group's TTL


@dataclass(frozen=True, slots=True)
class BrokerAck:
    """The member's Celery message, acknowledged by its report script: removed from
    kombu's unacked hash and index (keys.UNACKED_HASH / UNACKED_INDEX) in the broker's
    database of the same server, in the report's atomic step."""

    db: int  # the broker's database (keys.BROKER_DB)
    tag: str  # the message's delivery tag


@dataclass(frozen=True, slots=True)
class MemberOutcome:
    """One member's report and, when ``harvest``, what it teaches (its observations)."""

    group_id: str
    report: str  # MemberReport JSON: the reply and the trace
    ttl_s: float  # the group's TTL (the reply list, the outcome claim)
    harvest: bool  # False: the reply only (a member that never started)
    outcome_claim: str = ""  # the claim's key (liveness.outcome_key)
    owner: str = ""
    candidate_id: str = ""
    cand_obs: CandidateObservation | None = None
    link_id: str = ""
    src: str = ""
    dst: str = ""
    link_obs: Sequence[LinkObservation] = ()
    role: str = ""
    delay_s: float | None = None  # a success's latency for the role's hedge-delay window
    delay_window: int = 0  # the window's size (HacoSettings.hedge_delay_window)
    ack: BrokerAck | None = None  # its Celery message, acknowledged in the same step
    # A member of a group its first report may close (coordinator.state.closing): the
    # report is counted, and when it is the group's first, ``close`` (a success's; None
    # for a failure) closes the group and ``closed_token`` goes ahead of the reply.
    staged: bool = False
    close: GroupClose | None = None
    closed_token: str = ""


@dataclass(frozen=True, slots=True)
class OutcomeLimits:
    """TTLs and the stream cap a recorded outcome is written with (HacoSettings')."""

    profile_ttl_s: float
    trace_maxlen: int
    trace_ttl_s: float


def _signal(raw: bytes | str) -> GroupSignal | None:
    value = text(raw)
    return GroupSignal(value) if value else None


def candidate_json(o: CandidateObservation) -> str:
    return json.dumps(
        {
            "at_s": o.at_s, "delivered": o.delivered,
            "failure": None if o.failure is None else o.failure.value,
            "quality": o.quality, "proc_latency_s": o.proc_latency_s,
            "tokens_in": o.tokens_in, "tokens_out": o.tokens_out,
        },
        separators=(",", ":"),
    )  # fmt: skip


def legs_json(legs: Sequence[LinkObservation]) -> str:
    return json.dumps(
        [
            {
                "at_s": o.at_s, "bytes": o.bytes, "lost": o.lost,
                "t_transfer_s": o.t_transfer_s, "rtt_s": o.rtt_s,
                "can_be_lost": o.can_be_lost,
            }
            for o in legs
        ],
        separators=(",", ":"),
    )  # fmt: skip


def start_call(s: MemberStart) -> tuple[list[str], list[str | int]]:
    """A start's keys and arguments, as the start function takes them (both scripts)."""
    names = [keys.group_state(s.group_id), keys.idempotency(s.start_claim),
             keys.group_replies(s.group_id)]  # fmt: skip
    args: list[str | int] = [s.owner, max(1, int(s.ttl_s * _MS)), s.started_token,
                             int(s.past_deadline)]  # fmt: skip
    return names, args


def started_of(reply: Sequence[Any]) -> tuple[GroupSignal | None, Started]:
    """A start script's reply: the group's signal and whether the member runs."""
    return _signal(reply[0]), Started(int(reply[1]))


def decay_args(settings: ProfileSettings) -> list[str | int | float]:
    """The fold's settings as the script reads them (profile_fold.lua ``weight``)."""
    if math.isinf(settings.half_life):
        return ["none", 0, 1.0, settings.latency_window, settings.bandwidth_window]
    unit = "observations" if settings.decay_unit is DecayUnit.OBSERVATIONS else "seconds"
    # The per-observation weight as Python computes it (profiles.decay_weight), not Lua.
    w_obs = float(0.5 ** (1.0 / settings.half_life))
    return [unit, repr(settings.half_life), repr(w_obs), settings.latency_window,
            settings.bandwidth_window]  # fmt: skip


def _close_args(o: MemberOutcome, limits: OutcomeLimits) -> list[str | int]:
    """member_report.lua's ARGV from 10: the staged close this report makes should it be
    its group's first (the metrics' TTL is the profiles', as the coordinator's close)."""
    c = o.close
    if c is None or not o.staged:
        return [""]
    args: list[str | int] = [
        c.signal.value, c.winner_member or "", o.closed_token,
        max(1, int(limits.profile_ttl_s * _MS)), keys.VERDICT_FIELD, c.verdict, c.group_id,
    ]  # fmt: skip
    for name, n in c.counts.items():
        args += [name, n]
    return args


class RedisMemberOps:
    """Needs ``self.r`` (a client that does not decode responses), ``self._guard``
    (driver errors to StoreError) and ``self.profile_settings``: a RedisStore mixin."""

    r: redis.Redis
    profile_settings: ProfileSettings
    _guard: Callable[..., Any]
    records_delays = True  # report_member writes the hedge-delay window (keys.hedge_delay_window)

    def _init_member_ops(self, client: redis.Redis) -> None:
        """Register the two scripts (EVALSHA: their text is sent once): the store's init."""
        lean = lean_for(client)  # EVALSHA without redis-py's per-command path
        self._start_script = lean.script(script("member_start"))
        self._report_script = lean.script(script("member_report"))
        self._harvest_script = lean.script(script("member_harvest"))

    def start_member(self, s: MemberStart) -> tuple[GroupSignal | None, Started]:
        """The group's signal at the start, and whether the member runs."""
        names, args = start_call(s)
        run = self._start_script
        result: tuple[GroupSignal | None, Started] = self._guard(
            "start a member", lambda: started_of(run(keys=names, args=args))
        )
        return result

    def report_member(
        self, o: MemberOutcome, settings: ProfileSettings, limits: OutcomeLimits
    ) -> bool:
        """Reply and outcome claim in one script, then (``harvest``, and the outcome is
        this worker's) the profile fold, trace and delay sample in a second, sent once the
        first answered; True when the outcome was recorded."""
        report, harvest = self._report_script, self._harvest_script
        g, profile_ttl_ms = o.group_id, max(1, int(limits.profile_ttl_s * _MS))
        db, tag = ("", "") if o.ack is None else (o.ack.db, o.ack.tag)
        trace_args = [limits.trace_maxlen, max(1, int(limits.trace_ttl_s * _MS))]
        names = [
            keys.group_replies(g), keys.idempotency(o.outcome_claim or "-"), keys.TRACES,
            keys.UNACKED_INDEX, keys.UNACKED_HASH, keys.group_reports(g),
            keys.group_state(g), keys.group_winner(g), keys.METRICS, keys.CANCELLED,
        ]  # fmt: skip
        args: list[str | int | float] = [
            o.report, max(1, int(o.ttl_s * _MS)), o.owner, int(o.harvest), db, tag,
            *trace_args, "1" if o.staged else "", *_close_args(o, limits),
        ]  # fmt: skip
        recorded = bool(self._guard("report a member", lambda: report(keys=names, args=args)))
        if recorded:
            role = o.role or "-"
            names = [
                keys.PROFILE_EPOCH, keys.TRACES, keys.PROFILE_VERSIONS, keys.UNACKED_INDEX,
                keys.UNACKED_HASH, keys.hedge_delay_window(role), keys.hedge_delay_ranked(role),
            ]  # fmt: skip
            sample = "" if o.delay_s is None else window_entry(float(o.delay_s), o.outcome_claim)
            args = [
                o.report, keys.DELTA_PREFIX, o.candidate_id,
                "" if o.cand_obs is None else candidate_json(o.cand_obs),
                o.link_id, o.src, o.dst, legs_json(o.link_obs) if o.link_obs else "",
                *decay_args(settings), profile_ttl_ms, *trace_args, db, tag,
                sample, max(1, o.delay_window),
            ]  # fmt: skip
            self._guard("harvest a member", lambda: harvest(keys=names, args=args))
        if o.ack is not None:  # kombu's own ack of it has nothing left to remove
            SCRIPT_ACKS.add(o.ack.tag)
        return recorded
