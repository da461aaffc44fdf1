"""The ``best`` rule with outputs a real backend did not judge, carried out.

Once the coordinator's wait loop has a verdict (every member reported, or the deadline),
:func:`settle` decides the ``best`` rule's winner with the judge's scores
(:func:`coordinator.core.judged.decide_best`): it waits on the group's reply list, where
the judge worker LPUSHes a wake token next to each score it writes to
``keys.group_judged`` (``RuntimeStore.record_judged``), until every successful output is
judged or ``best_judge_wait_s`` (bounded by the group deadline) has passed. Without an
evaluator it falls back to ``ranked`` at once. The group records the rule used, the
reason for a fallback and the winner's quality, for the result (:func:`annotate`) and
the verdict record.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from coordinator.config import HacoSettings
from coordinator.core.judged import BestVerdict, decide_best
from coordinator.core.winner import Report, Verdict
from coordinator.runtime.group import Group
from coordinator.runtime.ports import RuntimeStore
from coordinator.runtime.results import InvocationResult
from schemas.enums import WinnerMode

MAX_POP_S = 1.0  # one blocking pop at most this long, then the clock is read again
MIN_POP_S = 0.001  # and at least this long (a zero timeout would block for ever in Redis)


def complete_reports(g: Group) -> list[Report | None]:
    """The launched members' reports relative to the group start, for a decided group:
    a member that did not report counts as failed at the deadline."""
    span = g.deadline_at - g.t0
    out: list[Report | None] = []
    for rank in range(g.launcher.launched):
        rep = g.reports[rank]
        if rep is None:
            out.append(Report(span, False))
        else:
            t = rep.trace
            out.append(Report(t.finished_at_s - g.t0, t.success, t.quality))
    return out


def _judged(store: RuntimeStore, g: Group) -> dict[int, float | None]:
    ranks = {g.member_id(r): r for r in range(g.launcher.launched)}
    return {ranks[m]: q for m, q in store.judged_scores(g.id).items() if m in ranks}


def settle(
    g: Group,
    v: Verdict,
    store: RuntimeStore,
    clock: Callable[[], float],
    settings: HacoSettings,
    evaluator: bool,
) -> Verdict:
    """The group's final verdict: ``v`` for the ``ranked`` and ``first`` rules (and
    when every member failed); for ``best``, the winner once the judgements are in."""
    g.winner_rule = g.call.winner_mode
    if g.call.winner_mode is not WinnerMode.BEST or v.winner is None:
        return v
    reports = complete_reports(g)
    now = clock()
    until = min(now + settings.best_judge_wait_s, g.deadline_at)
    while True:
        bv = decide_best(
            reports, _judged(store, g), evaluator=evaluator, now_s=now, wait_until_s=until
        )
        if bv.decided:
            return _record(g, bv)
        # A wake token (a judgement), or a late duplicate report: read the scores again.
        store.pop_reply(g.id, min(max(MIN_POP_S, until - now), MAX_POP_S))
        now = clock()


def _record(g: Group, bv: BestVerdict) -> Verdict:
    g.winner_rule, g.fallback_reason, g.winner_quality = bv.rule, bv.fallback_reason, bv.quality
    return Verdict(True, bv.winner)


def annotate(result: InvocationResult, g: Group) -> InvocationResult:
    """The result with the rule used, the reason for a fallback, and the winner's judged
    quality when the judge (not its backend) scored it."""
    quality = result.quality if result.quality is not None else g.winner_quality
    return dataclasses.replace(
        result, winner_rule=g.winner_rule, fallback_reason=g.fallback_reason, quality=quality
    )
