"""Discrete-event simulation of hedged role invocations in virtual time.

Nothing sleeps: member completions are events on a heap ordered by virtual time. An
invocation draws every member's call, finds when and how the group resolves with the
same winner rule as the live runtime (:mod:`coordinator.core.winner`), advances the clock to
that moment and hands the result to the workflow controller. Members still running
(kept for harvesting, as in the paper) complete later, in time order, interleaved with
the next invocations, and only then update the experience profiles.

Launch modes (:class:`SimOptions`, spec ``hedging.md``): ``parallel`` (the paper) starts
every member at t = 0; ``staggered`` starts rank 0 at once and the next rank when every
launched member has failed or the hedge delay passes with no success
(:func:`coordinator.core.stagger.schedule`). ``cancel_losers`` stops members still
running once the winner is certain: a cancelled member is no observation, and its tokens
count up to the cut (:func:`sim.memberdraw.cut_tokens`). The evaluator's ``best`` rule
(MoA) always runs parallel and in full.

Random streams: the main generator draws the decision, every member's call (launched or
not, so that launch modes see the same outcomes) and the evaluator's noise, exactly as
before launch modes existed; ``ctx_rng`` draws only the request context
(:meth:`SimWorld.begin_request`) and each successful member's ``solved`` verdict.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from coordinator.core.cofailure import CoFailure, failure_score, fold_group
from coordinator.core.evidence import DependenceMemo, PoolMember, build_view, link_id
from coordinator.core.methods import Method, PoolView
from coordinator.core.observations import observations
from coordinator.core.params import ProfileSettings
from coordinator.core.percentiles import median, nearest_rank
from coordinator.core.profiles import (
    CandidateProfile,
    LinkProfile,
    update_candidate,
    update_link_many,
)
from coordinator.core.stagger import Attempt, schedule
from coordinator.core.winner import Report, resolve
from coordinator.errors import InputError
from schemas.enums import LaunchMode, WinnerMode
from schemas.models import Candidate
from sim.candidates import CallDraw, link_observations
from sim.memberdraw import clip, cut_tokens, sim_trace
from sim.workflow import Invocation, StepResult
from sim.world import SimWorld


@dataclass(frozen=True)
class SimOptions:
    """How the simulator carries a decision out (the default is the paper's).

    - ``launch``: ``parallel`` or ``staggered`` (:class:`schemas.enums.LaunchMode`).
    - ``stagger_percentile``: the hedge delay after launching a member is this
      nearest-rank percentile of its candidate's recent *end-to-end* latencies (request
      leg + processing + response leg, as the caller measures them) of successes
      reported within the deadline (a window of ``ProfileSettings.latency_window``).
    - ``cold_delay_s``: the delay of a candidate with no such latency yet. None (the
      default): the median of the same percentile over the role's candidates that have
      one, or 0 when none has (launch at once: a cold pool runs parallel and learns).
    - ``cancel_losers``: cancel the members still running once the winner is certain.
    """

    launch: LaunchMode = LaunchMode.PARALLEL
    stagger_percentile: float = 95.0
    cold_delay_s: float | None = None
    cancel_losers: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "launch", LaunchMode(self.launch))
        if not 0.0 <= self.stagger_percentile <= 100.0:
            raise InputError(
                f"stagger_percentile={self.stagger_percentile!r}; expected a number in [0, 100]"
            )
        if self.cold_delay_s is not None and not 0.0 <= self.cold_delay_s < math.inf:
            raise InputError(f"cold_delay_s={self.cold_delay_s!r}; expected a finite delay >= 0")

    @property
    def label(self) -> str:
        if self.launch is LaunchMode.PARALLEL:
            base = "parallel"
        else:
            base = f"staggered-p{self.stagger_percentile:g}"
        return f"{base}+cancel" if self.cancel_losers else base


PARALLEL = SimOptions()


@dataclass(frozen=True, slots=True)
class InvocationRecord:
    """What the benchmark keeps of one role invocation."""

    task: int
    role: str
    members: tuple[str, ...]  # the hedge set decided, in rank order
    zones: tuple[str, ...]
    winner_zone: str | None
    all_failed: bool
    # Input + output tokens of every launched member; a cancelled one up to its cut.
    tokens: int
    judge_tokens: int  # the evaluator's: every observed success judged, kept apart
    latency_s: float
    p_success: float
    # Some launched member succeeded within the deadline, was not cancelled, and its
    # output is a qualified answer (solved = u < true quality, drawn from ctx_rng).
    qualified: bool = False
    winner_qualified: bool = False  # the winner's own output is a qualified answer
    stop: str = ""  # the decision's StopReason value
    p_success_indep: float = 0.0  # the paper's independent product for the same set
    achievable: float = 0.0  # the whole pool's P_succ (the allocation's ceiling)
    launched: int = 0  # members actually started (all of them under ``parallel``)
    cancelled: int = 0  # members stopped once the winner was certain


@dataclass
class _Tally:
    """What one group's launched members cost and gave."""

    tokens: int = 0
    judge_tokens: int = 0
    cancelled: int = 0
    qualified: bool = False


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
        *,
        ctx_rng: np.random.Generator | None = None,
        options: SimOptions | None = None,
    ) -> None:
        self.world = world
        self.pools = pools
        self.members = {
            r: [PoolMember(c.id, c.zone, c.model) for c in cs] for r, cs in pools.items()
        }
        self.method = method
        self.rng = rng
        # The request context's and the verdicts' stream; by default a child of ``rng``'s
        # seed (spawning draws nothing from ``rng``). The runner passes [seed, 3].
        self.ctx_rng = ctx_rng if ctx_rng is not None else rng.spawn(1)[0]
        self.options = options or PARALLEL
        self.settings = profile_settings or ProfileSettings()
        self.candidates: dict[str, CandidateProfile] = {}
        self.links: dict[str, LinkProfile] = {}
        self.cofailure = CoFailure()
        self.dependence = DependenceMemo(self.settings)
        # End-to-end latencies of successes within the deadline, per candidate (the
        # hedge delay's window; the profiles keep processing latency only).
        self.e2e_latency_s: dict[str, deque[float]] = {}
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
            self.dependence.get(self.members[role], self.cofailure),
        )

    def _harvest(
        self, cand: Candidate, draw: CallDraw, judged: float | None, at_s: float, late: bool
    ) -> None:
        """What the member's trace tells (coordinator.core.observations, the runtime's
        reading), with both legs of the call as the caller measured them. ``late``: the
        member finished after the group's deadline (a success then is a timeout, as the
        winner rule and the live runtime count it)."""
        trace = sim_trace(cand, self.world.caller_zone, draw, judged, at_s, late)
        net = self.world.scenario.network
        obs, legs = observations(trace, link_observations(draw, at_s, net))
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
        ctx = self.world.begin_request(self.ctx_rng)
        draws = [self.world.call(c, inv.request_bytes, self.rng, ctx) for c in chosen]
        noise = self.world.judge_noise()
        judged: list[float | None] = [
            None if d.quality is None else clip(d.quality + noise * self.rng.standard_normal())
            for d in draws
        ]
        # Whether each successful output is a qualified answer (u < its true quality).
        solved = [d.quality is not None and self.ctx_rng.random() < d.quality for d in draws]
        mode = decision.winner_mode
        launch_s, winner, resolved_s = self._launch(inv.role, mode, chosen, draws, judged)
        done_s = resolved_s
        if mode is WinnerMode.BEST and len(chosen) > 1:
            done_s += self.world.judge_latency_s()  # MoA waits for the evaluator's verdict
        cut_s = resolved_s if self.options.cancel_losers and mode is not WinnerMode.BEST else None
        tally = self._carry_out(start, chosen, draws, judged, solved, launch_s, cut_s)
        self.now_s = start + done_s
        self.events.run_until(self.now_s)
        alloc = decision.allocation
        self.records.append(
            InvocationRecord(
                task=self.task,
                role=inv.role,
                members=tuple(c.id for c in chosen),
                zones=tuple(c.zone for c in chosen),
                winner_zone=None if winner is None else chosen[winner].zone,
                all_failed=winner is None,
                tokens=tally.tokens,
                judge_tokens=tally.judge_tokens,
                latency_s=done_s,
                p_success=decision.p_success,
                qualified=tally.qualified,
                winner_qualified=winner is not None and solved[winner],
                stop=decision.stop.value,
                p_success_indep=decision.p_success if alloc is None else alloc.p_success_indep,
                achievable=decision.p_success if alloc is None else alloc.achievable,
                launched=sum(t is not None for t in launch_s),
                cancelled=tally.cancelled,
            )
        )
        if winner is None:
            return StepResult(ok=False)
        win = draws[winner]
        return StepResult(True, win.quality or 0.0, win.tokens_out)

    def _launch(
        self,
        role: str,
        mode: WinnerMode,
        chosen: list[Candidate],
        draws: list[CallDraw],
        judged: list[float | None],
    ) -> tuple[tuple[float | None, ...], int | None, float]:
        """Launch offsets (None: never launched), the winner and when it was certain."""
        deadline = self.world.deadline_s
        if self.options.launch is LaunchMode.STAGGERED and mode is not WinnerMode.BEST:
            attempts = [
                Attempt(d.total_s, d.failure is None, q) for d, q in zip(draws, judged, strict=True)
            ]
            delays = [self.hedge_delay_s(role, c) for c in chosen[:-1]]
            sch = schedule(mode, attempts, delays, deadline)
            return sch.launch_s, sch.winner, sch.at_s
        reports = [
            Report(d.total_s, d.failure is None, q) for d, q in zip(draws, judged, strict=True)
        ]
        res = resolve(mode, reports, deadline)
        return (0.0,) * len(draws), res.winner, res.at_s

    def _carry_out(
        self,
        start: float,
        chosen: list[Candidate],
        draws: list[CallDraw],
        judged: list[float | None],
        solved: list[bool],
        launch_s: tuple[float | None, ...],
        cut_s: float | None,
    ) -> _Tally:
        """Cost every launched member, cancel those running at ``cut_s`` (None: keep
        them), and schedule the others' harvest and the group's co-failure fold."""
        deadline = self.world.deadline_s
        per_output = self.world.evaluator_tokens_per_output()
        tally = _Tally()
        observed: list[tuple[str, float]] = []
        last_s = start
        for k, (cand, draw, q) in enumerate(zip(chosen, draws, judged, strict=True)):
            t0 = launch_s[k]
            if t0 is None:
                continue  # never launched: no cost, no observation
            end_s = t0 + draw.total_s
            if cut_s is not None and end_s > cut_s:
                tally.tokens += cut_tokens(draw, cut_s - t0)
                tally.cancelled += 1
                continue  # a cancelled member is no observation
            tally.tokens += draw.tokens_in + draw.tokens_out
            ok = draw.failure is None
            late = end_s > deadline
            if ok:
                tally.judge_tokens += draw.tokens_out + per_output
                tally.qualified = tally.qualified or (solved[k] and not late)
            at = start + end_s
            self.events.push(at, _bind(self._complete, cand, draw, q, at, late))
            observed.append((cand.id, failure_score(ok and not late, q if ok else None)))
            last_s = max(last_s, at)
        if len(observed) > 1:
            self.events.push(last_s, self._fold_action(observed, last_s))
        return tally

    def _complete(
        self, cand: Candidate, draw: CallDraw, judged: float | None, at_s: float, late: bool
    ) -> None:
        """A member reports: harvest it, and feed the hedge delay's latency window."""
        self._harvest(cand, draw, judged, at_s, late)
        if draw.failure is None and not late:
            window = self.e2e_latency_s.get(cand.id)
            if window is None:
                window = self.e2e_latency_s[cand.id] = deque(maxlen=self.settings.latency_window)
            window.append(draw.total_s)

    def _fold_action(self, observed: list[tuple[str, float]], at_s: float) -> Callable[[], None]:
        def fold() -> None:
            self.cofailure = fold_group(self.cofailure, observed, at_s, self.settings)

        return fold

    def hedge_delay_s(self, role: str, cand: Candidate) -> float:
        """The staggered hedge delay after launching ``cand`` (:class:`SimOptions`)."""
        pct = self.options.stagger_percentile
        window = self.e2e_latency_s.get(cand.id)
        if window:
            return nearest_rank(window, pct)
        if self.options.cold_delay_s is not None:
            return self.options.cold_delay_s
        known = [
            nearest_rank(w, pct) for c in self.pools[role] if (w := self.e2e_latency_s.get(c.id))
        ]
        return median(known, 0.0)

    def finish(self) -> None:
        """Let every background member complete (their traces still count)."""
        self.events.run_until(math.inf)


def _bind(
    fn: Callable[[Candidate, CallDraw, float | None, float, bool], None],
    cand: Candidate,
    draw: CallDraw,
    q: float | None,
    at: float,
    late: bool,
) -> Callable[[], None]:
    return lambda: fn(cand, draw, q, at, late)
