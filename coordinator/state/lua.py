"""The Redis Lua scripts of the state package, kept as ``.lua`` files beside this module
(shipped as package data) so they can be read, linted and diffed as Lua."""

from __future__ import annotations

import functools
from importlib import resources


@functools.cache
def lua(name: str) -> str:
    """The text of ``coordinator/state/<name>.lua``, read once per process."""
    return resources.files("coordinator.state").joinpath(f"{name}.lua").read_text(encoding="utf-8")


# Scripts that call Lua functions defined in other files (one function per file, shared
# between scripts): the files sent before the script's own, in this order.
PIECES: dict[str, tuple[str, ...]] = {
    "member_report": ("broker_ack", "group_close"),
    "delay_add": ("delay_record",),
    "member_harvest": ("broker_ack", "profile_fold", "delay_record"),
    "close_group": ("group_close",),
    "member_start": ("start_claim",),
    "lane_take": ("take_next",),
    "lane_start": ("start_claim", "take_next"),
    "open_send": ("queue_batch",),
    "send_members": ("queue_batch",),
}
# Files that only define a function for the scripts above: never sent on their own.
FUNCTIONS = frozenset(piece for pieces in PIECES.values() for piece in pieces)


@functools.cache
def script(name: str) -> str:
    """The text script ``name`` is sent as: the functions it calls, then its own file."""
    return "".join(lua(piece) for piece in PIECES.get(name, ())) + lua(name)
