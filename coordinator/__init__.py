"""HACO: hedged agent computing. ``from coordinator import HacoClient`` is the SDK.

The client is loaded on first use (a module ``__getattr__``), so that importing any part
of the package, the pure core above all, does not load the runtime and its drivers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from coordinator.runtime.client import HacoClient

__all__ = ["HacoClient"]


def __getattr__(name: str) -> Any:
    if name == "HacoClient":
        from coordinator.runtime.client import HacoClient  # noqa: PLC0415 - loaded on use

        return HacoClient
    raise AttributeError(f"module 'coordinator' has no attribute {name!r}")
