"""A harvested batch's acknowledgement (:mod:`coordinator.tracestore.harvester`), after
its commit: dead letters, counters and ``XACK`` all or nothing (``MULTI``), so an entry
is never acknowledged without its dead letter; then the batch out of the stream.

Packed by hiredis alone (:class:`coordinator.state.lean.LeanRedis`): redis-py's
per-argument pass over a batch's ids cost the harvest loop about as much as decoding the
batch. Entries leave the stream by ``XTRIM MINID`` below the group's oldest
unacknowledged entry (``coordinator/state/harvest_trim.lua``), one command for the
batch instead of an ``XDEL`` per id; an id acknowledged above an entry still pending
(another consumer's batch in flight) is deleted on its own, so the stream holds only
unacknowledged entries.
"""

from __future__ import annotations

from typing import Any

from coordinator.config import HacoSettings
from coordinator.state import keys
from coordinator.state.codec import text
from coordinator.state.lean import LeanRedis
from coordinator.state.lua import script
from coordinator.tracestore.tracecodec import Batch

_MS = 1000


def _stream_id(sid: bytes | str) -> tuple[int, int]:
    ms, _, seq = text(sid).partition("-")
    return int(ms), int(seq)


class HarvestAcks:
    """The acknowledgements of one consumer of ``group`` on ``stream`` (its harvester's)."""

    def __init__(self, lean: LeanRedis, stream: str, group: str, settings: HacoSettings) -> None:
        self.lean, self.stream, self.group, self.s = lean, stream, group, settings
        self._trim_script = lean.script(script("harvest_trim"))

    def finish(self, batch: Batch, counts: dict[str, int]) -> None:
        """``batch``'s dead letters, ``counts`` and its acknowledgement in one MULTI; then
        its entries out of the stream (:meth:`trim`)."""
        cap = self.s.harvest_dead_letter_maxlen
        commands: list[tuple[Any, ...]] = [
            ("XADD", keys.TRACES_DEAD, "MAXLEN", "~", cap, "*", "id", sid, "report", raw,
             "error", error)
            for sid, raw, error in batch.dead
        ]  # fmt: skip
        if batch.dead:
            ttl_ms = int(self.s.harvest_dead_letter_ttl_s * _MS)
            commands.append(("PEXPIRE", keys.TRACES_DEAD, ttl_ms))
        commands += self.count_commands(counts)
        if batch.ids:
            commands.append(("XACK", self.stream, self.group, *batch.ids))
        self.lean.transaction(*commands)
        self.trim(batch.ids)

    def trim(self, ids: list[str]) -> None:
        """The acknowledged entries out of the stream: below the group's oldest
        unacknowledged one at once, the rest of ``ids`` (acknowledged after an entry
        still pending) one by one."""
        if not ids:
            return
        floor = self._trim_script((self.stream,), (self.group, ids[-1]))
        if floor is not None:
            at = _stream_id(floor)
            if left := [sid for sid in ids if _stream_id(sid) >= at]:
                self.lean.execute("XDEL", self.stream, *left)

    def count_commands(self, counts: dict[str, int]) -> list[tuple[Any, ...]]:
        """The counters' increments (none for a zero) and the metrics' TTL, as commands."""
        commands: list[tuple[Any, ...]] = [
            ("HINCRBY", keys.METRICS, name, n) for name, n in counts.items() if n
        ]
        return [*commands, ("PEXPIRE", keys.METRICS, int(self.s.profile_ttl_s * _MS))]
