"""The Redis Lua scripts of the state package, kept as ``.lua`` files beside this module
(shipped as package data) so they can be read, linted and diffed as Lua."""

from __future__ import annotations

import functools
from importlib import resources


@functools.cache
def lua(name: str) -> str:
    """The text of ``coordinator/state/<name>.lua``, read once per process."""
    return resources.files("coordinator.state").joinpath(f"{name}.lua").read_text(encoding="utf-8")
