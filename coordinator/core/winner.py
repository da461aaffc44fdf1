"""Winner rules (spec §4) as pure functions.

:func:`verdict` looks at what has been reported so far (indexed by rank, ``None`` = not
yet reported) and says whether the group is decided. Both the simulator and the live
runtime call it after every report, so the rule exists once. :func:`resolve` replays a
complete set of reports in time order to find when and how a group resolved.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from coordinator.errors import PolicyError
from schemas.enums import WinnerMode


@dataclass(frozen=True, slots=True)
class Report:
    at_s: float  # when the member reported, relative to the group start
    success: bool
    quality: float | None = None  # judged quality, used by the ``best`` rule


@dataclass(frozen=True, slots=True)
class Verdict:
    decided: bool
    winner: int | None = None  # rank of the winner; None with decided = all failed

    @property
    def all_failed(self) -> bool:
        return self.decided and self.winner is None


PENDING = Verdict(decided=False)
ALL_FAILED = Verdict(decided=True)


def _ranked(reports: Sequence[Report | None]) -> Verdict:
    # The best-ranked success wins once every member ranked above it has reported.
    for rank, rep in enumerate(reports):
        if rep is None:
            return PENDING
        if rep.success:
            return Verdict(True, rank)
    return ALL_FAILED


def _first(reports: Sequence[Report | None]) -> Verdict:
    done = [(rep.at_s, rank) for rank, rep in enumerate(reports) if rep is not None and rep.success]
    if done:
        return Verdict(True, min(done)[1])
    return ALL_FAILED if all(r is not None for r in reports) else PENDING


def _best(reports: Sequence[Report | None]) -> Verdict:
    # Wait for everyone, then the highest judged quality (rank breaks ties).
    if any(r is None for r in reports):
        return PENDING
    winner: int | None = None
    top = -math.inf
    for rank, rep in enumerate(reports):
        if rep is not None and rep.success:
            q = rep.quality if rep.quality is not None else 0.0
            if q > top:
                top, winner = q, rank
    return Verdict(True, winner)


_RULES = {WinnerMode.RANKED: _ranked, WinnerMode.FIRST: _first, WinnerMode.BEST: _best}


def verdict(mode: WinnerMode, reports: Sequence[Report | None]) -> Verdict:
    """Decide from the reports so far; ``reports[i]`` belongs to the member of rank i."""
    return _RULES[mode](reports)


@dataclass(frozen=True, slots=True)
class Resolution:
    winner: int | None  # rank of the winner, None when every member failed
    at_s: float  # when the group resolved, relative to its start
    timed_out: tuple[int, ...]  # ranks that had not reported by the deadline


def resolve(
    mode: WinnerMode, reports: Sequence[Report], deadline_s: float = math.inf
) -> Resolution:
    """Replay complete reports in time order (ties by rank) until the group is decided.

    A report after ``deadline_s`` counts as a timeout at the deadline.
    """
    if not reports:
        raise PolicyError("no reports; a hedge group needs at least one member")
    effective: list[Report] = []
    late: list[int] = []
    for rank, rep in enumerate(reports):
        if rep.at_s > deadline_s:
            late.append(rank)
            effective.append(Report(deadline_s, False, None))
        else:
            effective.append(rep)
    seen: list[Report | None] = [None] * len(reports)
    v, at_s = PENDING, 0.0
    for rank in sorted(range(len(effective)), key=lambda r: (effective[r].at_s, r)):
        seen[rank] = effective[rank]
        v, at_s = verdict(mode, seen), effective[rank].at_s
        if v.decided:  # at the latest with the last report: a complete set decides
            break
    return Resolution(v.winner, at_s, tuple(late))
