"""The judge (spec §2, §5): scores a member's output against its request and folds the
score into the candidate's Beta posterior, ``α += q``, ``β += 1 − q``.

Members whose backend judged them (the simulator) carry their quality in the trace and
never come here. The others, when the pool config has an ``[evaluator]``, go to the
``haco.judge`` queue (:mod:`workers.app`) as a :class:`JudgeTask`; a :class:`Scorer`
scores them and :func:`apply_judgement` writes the score to the member's row and, only if
that row was updated (``judged_at`` and ``quality`` still NULL), to the candidate's
profile: a redelivered task counts nothing. Postgres commits first, then Redis: a crash
between the two loses one judgement from the online profile (the trace store keeps it),
never counts it twice. A task that comes before the harvester stored its row is retried.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import re
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import numpy as np
import psycopg
from pydantic import BaseModel, ConfigDict, Field

from coordinator.config import HacoSettings
from coordinator.core.params import ProfileSettings
from coordinator.errors import ConfigError, DatabaseError, InputError, ScoreError
from coordinator.state.memstore import MemoryStore
from coordinator.state.store import RedisStore
from coordinator.tracestore.db import require_autocommit
from schemas.models import Candidate, Identifier, MemberTask, Message, NonNegative
from schemas.pool import DEFAULT_JUDGE_PROMPT, import_callable
from schemas.scenario import Scenario
from workers.backends.base import Backend

PROFILE_TTL_S = HacoSettings.model_fields["profile_ttl_s"].default
GROUP_TTL_S = HacoSettings.model_fields["group_ttl_s"].default


class JudgeTask(BaseModel):
    """The payload of one task on the ``haco.judge`` queue."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    member_id: str = Field(min_length=1, max_length=96)
    candidate_id: Identifier
    finished_at_s: NonNegative
    request: list[Message]
    output: str
    # The member's hedge group: its judgement also goes to keys.group_judged, for a
    # coordinator waiting on the ``best`` rule. None: nobody waits (an older payload).
    group_id: str | None = Field(default=None, min_length=1, max_length=64)


class Scorer(Protocol):
    def score(self, request: list[Message], output: str) -> float:
        """The output's quality for this request, normalized to [0, 1]."""
        ...


def checked_score(value: object, source: str) -> float:
    """``value`` as a float in [0, 1]; never clamped: anything else is a ScoreError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ScoreError(f"{source} returned {value!r}; expected a number in [0, 1]")
    q = float(value)
    if not math.isfinite(q) or not 0.0 <= q <= 1.0:
        raise ScoreError(f"{source} returned {q!r}; expected a score in [0, 1]")
    return q


def render_request(request: Sequence[Message]) -> str:
    return "\n".join(f"{m.role}: {m.content}" for m in request)


class CallableScorer:
    """A user's check, ``fn(request: list[Message], output: str) -> float`` in [0, 1],
    named by its import path ``"pkg.module:function"``."""

    def __init__(self, import_path: str) -> None:
        try:
            self.fn = import_callable(import_path)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        self.path = import_path

    def score(self, request: list[Message], output: str) -> float:
        try:
            value = self.fn(request, output)
        except Exception as exc:  # user code: its failure is this judgement's reason
            raise ScoreError(f"scorer {self.path!r} raised {exc!r}") from exc
        return checked_score(value, f"scorer {self.path!r}")


class SimJudge:
    """A simulated judge of real outputs. Their true quality is unknown: a stand-in comes
    from a hash of request and output (uniform in [0.25, 0.75], so noise is rarely
    clipped), plus Gaussian noise of std ``judge_noise``, the evaluator model's in the
    scenario (a weaker evaluator judges more noisily), clipped to [0, 1] as the simulated
    backend does. Deterministic for a seeded ``rng``; thread-safe."""

    def __init__(self, judge_noise: float, rng: np.random.Generator) -> None:
        if not judge_noise >= 0.0:
            raise InputError(f"judge_noise={judge_noise!r}; expected >= 0")
        self.judge_noise = judge_noise
        self._rng = rng
        self._lock = threading.Lock()

    @classmethod
    def for_model(
        cls, scenario: Scenario, model: str | None = None, rng: np.random.Generator | None = None
    ) -> SimJudge:
        name = model or scenario.evaluator.model
        if name not in scenario.models:
            raise ConfigError(f"evaluator model {name!r} is not in scenario {scenario.name!r}")
        return cls(scenario.models[name].judge_noise, rng or np.random.default_rng())

    @staticmethod
    def stand_in_quality(request: Sequence[Message], output: str) -> float:
        digest = hashlib.sha256(f"{render_request(request)}\0{output}".encode()).digest()
        return 0.25 + 0.5 * int.from_bytes(digest[:8], "big") / 2.0**64

    def score(self, request: list[Message], output: str) -> float:
        with self._lock:
            noise = self.judge_noise * float(self._rng.standard_normal())
        return min(1.0, max(0.0, self.stand_in_quality(request, output) + noise))


_NUMBER = r"(\d+(?:\.\d+)?)"
_SCALE = rf"\s*(?:(?:/|out\s+of)\s*{_NUMBER}|(%))?"
_SCORE_RE = re.compile(rf"score[^\w/\-]{{0,5}}{_NUMBER}{_SCALE}", re.IGNORECASE)
_BARE_RE = re.compile(rf"\s*{_NUMBER}{_SCALE}\s*", re.IGNORECASE)
_JSON_RE = re.compile(r"\{[^{}]*\}")


def _normalized(raw: str, scale: str | None, percent: bool) -> float:
    """One score on its scale: ``n/d`` → n/d, ``n%`` → n/100; a bare number is a
    fraction if written with a decimal point and ≤ 1, else read out of 10 (the prompt's)."""
    value = float(raw)
    if percent:
        return value / 100.0
    if scale is not None:
        if float(scale) <= 0:
            raise ScoreError(f"score {raw}/{scale}: the scale must be positive")
        return value / float(scale)
    return value if "." in raw and value <= 1.0 else value / 10.0


def _from_json(text: str) -> float | None:
    for blob in reversed(_JSON_RE.findall(text)):
        try:
            data: Any = json.loads(blob)
        except json.JSONDecodeError:
            continue
        value = data.get("score") if isinstance(data, dict) else None
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        return _normalized(repr(value) if isinstance(value, float) else str(value), None, False)
    return None


def parse_score(text: str) -> float:
    """The score in an evaluator's answer, normalized: a JSON object ``{"score": 0.7}``,
    else the last ``Score: 7/10`` (``7 out of 10``, ``70%``, ``0.7``), else an answer
    that is only such a number."""
    found = _from_json(text)
    if found is None:
        matches = list(_SCORE_RE.finditer(text))
        match = matches[-1] if matches else _BARE_RE.fullmatch(text)
        if match is None:
            raise ScoreError(f"no score in the evaluator's answer {text[:200]!r}")
        found = _normalized(match.group(1), match.group(2), match.group(3) is not None)
    return checked_score(found, f"the evaluator's answer {text[:200]!r}")


class LLMJudge:
    """LLM-as-judge: the evaluator candidate answers the judge prompt through its backend."""

    timeout_s = 120.0  # the evaluator call's deadline

    def __init__(
        self, backend: Backend, candidate: Candidate, prompt: str = DEFAULT_JUDGE_PROMPT
    ) -> None:
        self.backend, self.candidate, self.prompt = backend, candidate, prompt

    def prompt_for(self, request: Sequence[Message], output: str) -> list[Message]:
        values = {"request": render_request(request), "output": output}
        # One pass: text inside the request or output is never substituted again.
        text = re.sub(r"\{(request|output)\}", lambda m: values[m.group(1)], self.prompt)
        return [Message(role="user", content=text)]

    def score(self, request: list[Message], output: str) -> float:
        now, jid = time.time(), uuid.uuid4().hex
        task = MemberTask(
            group_id=f"judge-{jid}", member_id=f"judge-{jid}.0", rank=0, candidate=self.candidate,
            caller_zone=self.candidate.zone, payload=self.prompt_for(request, output),
            deadline_at_s=now + self.timeout_s, enqueued_at_s=now,
        )  # fmt: skip
        res = self.backend.call(task, lambda: False)
        if res.failure is not None or res.output is None:
            why = f"{res.failure.value}: {res.reason}" if res.failure else "no output"
            raise ScoreError(f"evaluator {self.candidate.id!r} failed ({why})")
        return parse_score(res.output)


class Outcome(StrEnum):
    APPLIED = "applied"  # scored, written to the row and the candidate's Beta
    DUPLICATE = "duplicate"  # the row was judged already (a redelivery): nothing counted
    NOT_FOUND = "not_found"  # no row yet (not harvested): retry later
    UNSCORED = "unscored"  # the scorer gave no score: nothing applied


@dataclass(frozen=True, slots=True)
class Judged:
    outcome: Outcome
    score: float | None = None
    reason: str | None = None


JudgeStore = RedisStore | MemoryStore
Conn = psycopg.Connection[Any]

_UPDATE = """
UPDATE members SET quality = %s, judged_at = now()
WHERE member_id = %s AND finished_at = to_timestamp(%s) AND candidate_id = %s
    AND judged_at IS NULL AND quality IS NULL
RETURNING member_id
"""
_STATE = """
SELECT candidate_id, judged_at IS NOT NULL OR quality IS NOT NULL FROM members
WHERE member_id = %s AND finished_at = to_timestamp(%s)
"""


def _row_state(conn: Conn, member_id: str, candidate_id: str, finished_at: float) -> Outcome | None:
    """NOT_FOUND, DUPLICATE (judged), or None when the row awaits its judgement."""
    try:
        row = conn.execute(_STATE, (member_id, finished_at)).fetchone()
    except psycopg.Error as exc:
        raise DatabaseError(f"cannot read member {member_id!r}: {str(exc).strip()}") from exc
    if row is None:
        return Outcome.NOT_FOUND
    if row[0] != candidate_id:
        raise InputError(f"member {member_id!r} is of candidate {row[0]!r}, not {candidate_id!r}")
    return Outcome.DUPLICATE if row[1] else None


def apply_judgement(
    store: JudgeStore, pg_conn: Conn, member_id: str, candidate_id: str, finished_at: float,
    score: float, *, settings: ProfileSettings | None = None, ttl_s: float = PROFILE_TTL_S,
) -> Outcome:  # fmt: skip
    """Write ``score`` to the member's row (``finished_at`` in epoch seconds, as traced)
    and, only if this call updated the row, apply it to the candidate's Beta. ``pg_conn``
    must be in autocommit mode, so the row is committed before the profile changes."""
    q = checked_score(score, f"the judgement of member {member_id!r}")
    require_autocommit(pg_conn, "apply_judgement")  # commit, then Redis
    try:
        updated = pg_conn.execute(_UPDATE, (q, member_id, finished_at, candidate_id)).fetchone()
    except psycopg.Error as exc:
        raise DatabaseError(f"cannot judge member {member_id!r}: {str(exc).strip()}") from exc
    if updated is None:  # not there, judged already, or judged since the caller looked
        return _row_state(pg_conn, member_id, candidate_id, finished_at) or Outcome.DUPLICATE
    store.apply_quality(candidate_id, q, settings or ProfileSettings(), ttl_s, finished_at)
    return Outcome.APPLIED


def judge_member(
    task: JudgeTask,
    scorer: Scorer,
    store: JudgeStore,
    pg_conn: Conn,
    settings: ProfileSettings | None = None,
    ttl_s: float = PROFILE_TTL_S,
    group_ttl_s: float = GROUP_TTL_S,
) -> Judged:
    """Score one member and apply it. A missing or already judged row is answered before
    scoring, so neither a retry nor a redelivery pays for another evaluator call. An
    applied or unscorable judgement is also told to the member's group
    (``store.record_judged``: keys.group_judged and a wake token), for the ``best`` rule."""
    state = _row_state(pg_conn, task.member_id, task.candidate_id, task.finished_at_s)
    if state is not None:
        return Judged(state)
    try:
        q = scorer.score(list(task.request), task.output)
    except ScoreError as exc:
        _tell_group(store, task, None, group_ttl_s)
        return Judged(Outcome.UNSCORED, reason=str(exc))
    out = apply_judgement(
        store, pg_conn, task.member_id, task.candidate_id, task.finished_at_s, q,
        settings=settings, ttl_s=ttl_s,
    )  # fmt: skip
    if out is Outcome.APPLIED:
        _tell_group(store, task, q, group_ttl_s)
    return Judged(out, score=q)


def _tell_group(store: JudgeStore, task: JudgeTask, q: float | None, ttl_s: float) -> None:
    if task.group_id is not None:
        store.record_judged(task.group_id, task.member_id, q, ttl_s)
