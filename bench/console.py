"""Where benchmarks print: JSON on stdout, tables on stderr (wide enough on a pipe)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

PIPE_WIDTH = 150  # rich assumes 80 columns on a pipe, which truncates the wide tables
err = Console(stderr=True, width=None if sys.stderr.isatty() else PIPE_WIDTH)


def show(renderable: Any) -> None:
    err.print(renderable)


def emit(res: dict[str, Any], table: Any, json_path: Path | None) -> None:
    """A bench's end: its table on stderr, its JSON on stdout and, with ``json_path``,
    in that file too."""
    show(table)
    text = json.dumps(res, indent=2)
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(text + "\n")
    print(text)
