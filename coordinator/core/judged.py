"""The ``best`` winner rule (spec §4 choice) when outputs may be unjudged: pure.

A simulated backend judges its own output; a real one does not (its report's quality is
None), and its score comes later from the judge queue. :func:`decide_best` says, from
the complete reports, the judge's scores so far and the time, whether the group is
decided and how:

- every successful output judged (by its backend or the judge): ``best``, the highest
  score, ties to the better rank (as :func:`coordinator.core.winner.verdict`);
- no evaluator configured: nothing will ever judge them, so ``ranked`` at once, said so;
- some unjudged and the wait not over: pending;
- the wait over: ``best`` among the judged outputs, said so when some were not judged;
  none judged: ``ranked``, said so.

A score of None from the judge means it could not score that output: judged, with no
score. The runtime (:mod:`coordinator.runtime.judging`) waits and carries this out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from coordinator.core.winner import Report, verdict
from schemas.enums import WinnerMode

NO_EVALUATOR = "no evaluator is configured: the outputs cannot be judged"
NONE_JUDGED = "no successful output has a judged score after the judge wait"
SOME_UNJUDGED = "{n} of {m} successful outputs have no judged score: best of the judged ones"


@dataclass(frozen=True, slots=True)
class BestVerdict:
    decided: bool
    winner: int | None = None  # rank; None with decided = every member failed
    rule: WinnerMode = WinnerMode.BEST  # the rule that picked the winner
    fallback_reason: str | None = None  # why not plain ``best`` (None: it was)
    quality: float | None = None  # the winner's judged quality, when it has one


PENDING = BestVerdict(decided=False)


def _scores(
    reports: Sequence[Report], judged: Mapping[int, float | None]
) -> tuple[dict[int, float], list[int]]:
    """The successes' scores (backend's or judge's) and the ranks still awaiting one."""
    scores: dict[int, float] = {}
    waiting: list[int] = []
    for rank, rep in enumerate(reports):
        if not rep.success:
            continue
        q = rep.quality if rep.quality is not None else judged.get(rank)
        if q is not None:
            scores[rank] = q
        elif rank not in judged:
            waiting.append(rank)
    return scores, waiting


def decide_best(
    reports: Sequence[Report | None],
    judged: Mapping[int, float | None],
    *,
    evaluator: bool,
    now_s: float,
    wait_until_s: float,
) -> BestVerdict:
    """``reports[i]``: the member of rank i (None: not reported); ``judged``: rank -> the
    judge's score so far (None: unscorable). Times in any one clock."""
    if any(r is None for r in reports):
        return PENDING
    done = [r for r in reports if r is not None]
    successes = sum(r.success for r in done)
    if successes == 0:
        return BestVerdict(True, None)
    scores, waiting = _scores(done, judged)
    if len(scores) == successes:
        win = min(scores, key=lambda r: (-scores[r], r))
        return BestVerdict(True, win, quality=scores[win])
    if not evaluator:
        return _ranked(done, NO_EVALUATOR)
    if waiting and now_s < wait_until_s:
        return PENDING
    if not scores:
        return _ranked(done, NONE_JUDGED)
    win = min(scores, key=lambda r: (-scores[r], r))
    reason = SOME_UNJUDGED.format(n=successes - len(scores), m=successes)
    return BestVerdict(True, win, WinnerMode.BEST, reason, scores[win])


def _ranked(reports: Sequence[Report], reason: str) -> BestVerdict:
    v = verdict(WinnerMode.RANKED, reports)
    q = reports[v.winner].quality if v.winner is not None else None
    return BestVerdict(True, v.winner, WinnerMode.RANKED, reason, q)
