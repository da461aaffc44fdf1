"""A relayed stream's worker side (``MemberTask.stream_to``, keys.member_chunks).

- :class:`ChunkSink`: the backend hands it the content deltas of each read (one XADD
  round trip per read, however many deltas it held); after the call, :meth:`end` appends
  the end entry (``ok`` with the token counts, or ``failed`` with the reason). A backend
  that does not stream (the simulator, a plain response) sends its whole output as one
  delta at the end.
- :func:`streaming_stop`: a relay cancels the group at the first token to stop the other
  members; the member whose stream is relayed (keys.stream_winner) keeps running. The
  key is read only once the group is cancelled: a loser stops at its first read; the
  winner re-reads it at each check (a relay whose client went away deletes it).
"""

from __future__ import annotations

import logging

from coordinator.errors import StoreError
from coordinator.runtime.ports import RuntimeStore
from schemas.models import MemberTask
from workers.backends.base import BackendResult, StopCheck

log = logging.getLogger(__name__)


class ChunkSink:
    def __init__(self, store: RuntimeStore, key: str, ttl_s: float) -> None:
        self.store = store
        self.key = key
        self.ttl_s = ttl_s
        self.sent = 0

    def __call__(self, parts: list[str]) -> None:
        delta = "".join(parts)
        if delta and self._append([{"d": delta}]):
            self.sent += 1

    def end(self, result: BackendResult) -> None:
        entries: list[dict[str, str]] = []
        if result.failure is None and self.sent == 0 and result.output:
            entries.append({"d": result.output})
        end = "ok" if result.failure is None else "failed"
        entries.append(
            {
                "end": end,
                "reason": result.reason or (result.failure.value if result.failure else ""),
                "tokens_in": str(result.tokens_in),
                "tokens_out": str(result.tokens_out),
            }
        )
        self._append(entries)

    def _append(self, entries: list[dict[str, str]]) -> bool:
        """A lost append is logged: the call and its report go on (its relay, if any, ends
        at its deadline without the member's end entry)."""
        try:
            self.store.append_chunks(self.key, entries, self.ttl_s)
        except StoreError as exc:
            log.warning("stream %s: %d entries not appended: %s", self.key, len(entries), exc)
            return False
        return True


def streaming_stop(base: StopCheck, store: RuntimeStore, task: MemberTask) -> StopCheck:
    """``base``, except for the member whose stream is relayed."""
    lost: list[bool] = []

    def stop() -> bool:
        if lost or not base():
            return bool(lost)
        try:
            relayed = store.stream_winner(task.group_id) == task.member_id
        except StoreError:  # unknown: the group's cancel holds
            relayed = False
        if not relayed:
            lost.append(True)
        return bool(lost)

    return stop
