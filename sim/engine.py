"""Discrete-event simulation of hedged role invocations in virtual time.

Nothing sleeps: member completions are events on a heap ordered by virtual time. An
invocation draws every member's call, finds when and how the group resolves with the
same winner rule as the live runtime (:mod:`coordinator.core.winner`), advances the clock to
that moment and hands the result to the workflow controller. Members still running
(kept for harvesting, as in the paper) complete later, in time order, interleaved with
the next invocations, and only then update the experience profiles.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from coordinator.core.evidence import PoolMember, build_view, link_id
from coordinator.core.methods import Method, PoolView
from coordinator.core.observations import observations
from coordinator.core.params import ProfileSettings
from coordinator.core.profiles import (
    CandidateProfile,
    LinkProfile,
    update_candidate,
    update_link_many,
)
from coordinator.core.winner import Report, resolve
from schemas.enums import MemberStatus, WinnerMode
from schemas.models import Candidate, MemberTrace
from sim.candidates import CallDraw, link_observations
from sim.workflow import Invocation, StepResult
from sim.world import SimWorld


@dataclass(frozen=True, slots=True)
class InvocationRecord:
    """What the benchmark keeps of one role invocation."""

    task: int
    role: str
    members: tuple[str, ...]
    zones: tuple[str, ...]
    winner_zone: str | None
    all_failed: bool
    tokens: int  # input + output tokens of every executed member
    judge_tokens: int
    latency_s: float
    p_success: float


@dataclass
class _Events:
    heap: list[tuple[float, int, Callable[[], None]]] = field(default_factory=list)
    seq: int = 0

    def push(self, at_s: float, action: Callable[[], None]) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at_s, self.seq, action))

    def run_until(self, t_s: float) -> None:
        while self.heap and self.heap[0][0] <= t_s:
            heapq.heappop(self.heap)[2]()


class Simulation:
    """One method on one scenario world, with its own profiles and random stream."""

    def __init__(
        self,
        world: SimWorld,
        pools: dict[str, list[Candidate]],
        method: Method,
        rng: np.random.Generator,
        profile_settings: ProfileSettings | None = None,
    ) -> None:
        self.world = world
        self.pools = pools
        self.members = {r: [PoolMember(c.id, c.zone) for c in cs] for r, cs in pools.items()}
        self.method = method
        self.rng = rng
        self.settings = profile_settings or ProfileSettings()
        self.candidates: dict[str, CandidateProfile] = {}
        self.links: dict[str, LinkProfile] = {}
        self.events = _Events()
        self.now_s = 0.0
        self.task = 0
        self.records: list[InvocationRecord] = []

    # -- evidence ---------------------------------------------------------------------
    def view(self, role: str, request_bytes: float) -> PoolView:
        return build_view(
            self.members[role],
            self.world.caller_zone,
            self.candidates,
            self.links,
            request_bytes,
            self.settings,
        )

    def _harvest(self, cand: Candidate, draw: CallDraw, judged: float | None, at_s: float) -> None:
        """What the member's trace tells (coordinator.core.observations, the runtime's
        reading), with both legs of the call as the caller measured them."""
        trace = _trace(cand, self.world.caller_zone, draw, judged, at_s)
        obs, legs = observations(trace, link_observations(draw, at_s))
        if obs is not None:
            prof = self.candidates.get(cand.id) or CandidateProfile(cand.id)
            self.candidates[cand.id] = update_candidate(prof, obs, self.settings)
        if legs:
            lid = link_id(self.world.caller_zone, cand.zone)
            link = self.links.get(lid) or LinkProfile(self.world.caller_zone, cand.zone)
            self.links[lid] = update_link_many(link, legs, self.settings)

    # -- one invocation ---------------------------------------------------------------
    def invoke(self, inv: Invocation) -> StepResult:
        pool = self.pools[inv.role]
        decision = self.method.decide(self.view(inv.role, inv.request_bytes), self.rng)
        chosen = [pool[i] for i in decision.members]
        start = self.now_s
        draws = [self.world.call(c, inv.request_bytes, self.rng) for c in chosen]
        noise = self.world.judge_noise()
        judged: list[float | None] = [
            None if d.quality is None else _clip(d.quality + noise * self.rng.standard_normal())
            for d in draws
        ]
        reports = [
            Report(d.total_s, d.failure is None, q) for d, q in zip(draws, judged, strict=True)
        ]
        res = resolve(decision.winner_mode, reports, self.world.deadline_s)
        done_s = res.at_s
        if decision.winner_mode is WinnerMode.BEST and len(chosen) > 1:
            done_s += self.world.judge_latency_s()  # MoA waits for the evaluator's verdict
        for cand, draw, q in zip(chosen, draws, judged, strict=True):
            at = start + draw.total_s
            self.events.push(at, _bind(self._harvest, cand, draw, q, at))
        self.now_s = start + done_s
        self.events.run_until(self.now_s)
        self._record(inv, decision.p_success, chosen, draws, res.winner, done_s)
        if res.winner is None:
            return StepResult(ok=False)
        win = draws[res.winner]
        return StepResult(True, win.quality or 0.0, win.tokens_out)

    def _record(
        self,
        inv: Invocation,
        p_success: float,
        chosen: Sequence[Candidate],
        draws: Sequence[CallDraw],
        winner: int | None,
        latency_s: float,
    ) -> None:
        per_output = self.world.evaluator_tokens_per_output()
        self.records.append(
            InvocationRecord(
                task=self.task,
                role=inv.role,
                members=tuple(c.id for c in chosen),
                zones=tuple(c.zone for c in chosen),
                winner_zone=None if winner is None else chosen[winner].zone,
                all_failed=winner is None,
                tokens=sum(d.tokens_in + d.tokens_out for d in draws),
                judge_tokens=sum(d.tokens_out + per_output for d in draws if d.failure is None),
                latency_s=latency_s,
                p_success=p_success,
            )
        )

    def finish(self) -> None:
        """Let every background member complete (their traces still count)."""
        self.events.run_until(math.inf)


def _trace(
    cand: Candidate, caller_zone: str, draw: CallDraw, judged: float | None, at_s: float
) -> MemberTrace:
    """The trace a worker would write for a simulated call (workers.backends.simulated
    maps a draw the same way). Validation is skipped: the draw is consistent by
    construction, and the simulator makes many."""
    req = draw.request
    ok = draw.failure is None
    delivered = not req.lost
    return MemberTrace.model_construct(
        invocation_id="", member_id="", candidate_id=cand.id, role=cand.role,
        model=cand.model, zone=cand.zone, caller_zone=caller_zone, rank=0, u_plus=0.0,
        r_minus=0.0, group_id="", started_at_s=max(0.0, at_s - draw.total_s),
        finished_at_s=at_s, status=MemberStatus.SUCCEEDED if ok else MemberStatus.FAILED,
        failure_kind=draw.failure, failure_reason=None, success=ok,
        quality=judged if ok else None, latency_s=draw.total_s,
        proc_latency_s=draw.proc_latency_s, tokens_in=draw.tokens_in,
        tokens_out=draw.tokens_out, bytes_sent=int(req.bytes),
        rtt_s=req.t_path_s if delivered else None,
        bandwidth_Bps=req.bytes / req.t_tx_s if delivered and req.t_tx_s else None,
        lost=req.lost or (draw.response is not None and draw.response.lost),
    )  # fmt: skip


def _clip(x: float) -> float:
    return 0.0 if x < 0.0 else min(x, 1.0)


def _bind(
    fn: Callable[[Candidate, CallDraw, float | None, float], None],
    cand: Candidate,
    draw: CallDraw,
    q: float | None,
    at: float,
) -> Callable[[], None]:
    return lambda: fn(cand, draw, q, at)
