"""A group still to be opened when its members go out.

A coordinator that planned on a cached view (HacoSettings.plan_view_fresh_s: no read, so
nothing opened) hands this to the dispatcher with the group's initial members. The group
must be open before any member can start (a member of a group with no state key never
starts: workers/member.py), so a dispatcher opens it first: in the same round trip as
the send where it can (``open_send.lua``, CeleryDispatcher), else by :attr:`open`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GroupOpening:
    group_id: str
    ttl_s: float  # the group state's TTL (HacoSettings.group_ttl_s)
    # The hedge budget's credit for this invocation and the budget hash's TTL in ms
    # (RedisBudget.plan_credit), added to its ``pend`` field; None: nothing to credit.
    credit: tuple[float, int] | None
    open: Callable[[], object]  # the store's own open (and credit), one round trip
