"""Shared pieces of the `haco` command line: the apps, the consoles, error handling."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from coordinator.errors import HacoError, InputError

app = typer.Typer(
    help="HACO: reliability-targeted hedging for LLM agent fleets.", no_args_is_help=True
)
bench_app = typer.Typer(help="Benchmarks that print JSON and a table.", no_args_is_help=True)
scenarios_app = typer.Typer(help="Simulator scenario files.", no_args_is_help=True)
schemas_app = typer.Typer(help="Exported JSON Schemas of the message models.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
app.add_typer(scenarios_app, name="scenarios")
app.add_typer(schemas_app, name="schemas")

PIPE_WIDTH = 150  # rich assumes 80 columns on a pipe, which truncates the wide tables
out = Console()
err = Console(stderr=True, width=None if sys.stderr.isatty() else PIPE_WIDTH)


def show(renderable: Any) -> None:
    err.print(renderable)


F = TypeVar("F", bound=Callable[..., Any])


def clean_errors(fn: F) -> F:
    """Turn HACO errors into one message per line and an exit status, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except HacoError as exc:
            for line in str(exc).splitlines():
                # Escaped: messages quote user input, and "[x]" would read as markup.
                err.print(f"[bold red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)
            # Bad input exits 2; a call that ran and failed (all members failed, the
            # services are down) exits 1.
            raise typer.Exit(code=2 if isinstance(exc, InputError) else 1) from exc

    return wrapper  # type: ignore[return-value]


def read_input(source: str) -> tuple[str, str]:
    if source == "-":
        return sys.stdin.read(), "stdin"
    try:
        return Path(source).read_text(encoding="utf-8"), source
    except OSError as exc:
        raise InputError(f"cannot read {source!r}: {exc.strerror or exc}") from exc
