"""Where benchmarks print: JSON on stdout, tables on stderr (wide enough on a pipe)."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console

PIPE_WIDTH = 150  # rich assumes 80 columns on a pipe, which truncates the wide tables
err = Console(stderr=True, width=None if sys.stderr.isatty() else PIPE_WIDTH)


def show(renderable: Any) -> None:
    err.print(renderable)
