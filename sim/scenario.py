"""Load scenario files: TOML, with ``extends`` for variations of a base scenario.

A file may say ``extends = "overall.toml"`` (relative to itself): the base is loaded
first and the file's tables are merged over it key by key; arrays (``candidates``,
``links``, ``changes`` …) are replaced whole, and so is a table whose ``kind`` differs
from the base's (a trace latency model replacing a lognormal one). Trace files named
by a latency model are resolved relative to the file that names them.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from coordinator.errors import InputError, ScenarioError, describe_validation_error
from schemas.scenario import Scenario

# The paper's four settings (independent failures), then the correlated-failure ones.
PAPER = ("overall", "candidate_degradation", "network_degradation", "evaluator_degradation")
CORRELATED = ("zone_shock", "model_shock", "hardness")
BUILTIN = PAPER + CORRELATED
_MAX_EXTENDS_DEPTH = 8  # a chain longer than this is a cycle or a mistake


def builtin_path(name: str) -> Path:
    if name not in BUILTIN:
        raise ScenarioError(f"unknown scenario {name!r}; expected one of {', '.join(BUILTIN)}")
    return Path(str(resources.files("sim").joinpath("scenarios", f"{name}.toml")))


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        old = out.get(key)
        # A table naming another ``kind`` is another variant: it replaces, not merges.
        if (
            isinstance(value, dict)
            and isinstance(old, dict)
            and value.get("kind", old.get("kind")) == old.get("kind")
        ):
            out[key] = _merge(old, value)
        else:
            out[key] = value
    return out


def _resolve_traces(raw: dict[str, Any], folder: Path) -> None:
    models = raw.get("models")
    if not isinstance(models, dict):
        return
    for spec in models.values():
        latency = spec.get("latency") if isinstance(spec, dict) else None
        if isinstance(latency, dict) and latency.get("kind") == "trace":
            file = latency.get("file")
            if isinstance(file, str) and not Path(file).is_absolute():
                latency["file"] = str((folder / file).resolve())


def read_toml(path: Path, what: str, error: type[InputError]) -> dict[str, Any]:
    """The TOML file ``path`` (a ``what``: "scenario file", "pool config") as a dict;
    ``error`` names the file and says whether it is missing, unreadable or not TOML."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise error(f"{what} {str(path)!r} does not exist") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read {what} {str(path)!r}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: not valid TOML: {exc}") from exc


def _read_raw(path: Path, depth: int) -> dict[str, Any]:
    if depth > _MAX_EXTENDS_DEPTH:
        raise ScenarioError(f"{path}: 'extends' chain deeper than {_MAX_EXTENDS_DEPTH} files")
    raw = read_toml(path, "scenario file", ScenarioError)
    _resolve_traces(raw, path.parent)
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    if not isinstance(parent, str):
        raise ScenarioError(f"{path}: extends = {parent!r}; expected a file name")
    return _merge(_read_raw((path.parent / parent).resolve(), depth + 1), raw)


def load_scenario(path: str | Path) -> Scenario:
    """Load and validate one scenario file; every problem names its place and value."""
    p = Path(path)
    raw = _read_raw(p, 0)
    try:
        return Scenario.model_validate(raw)
    except ValidationError as exc:
        raise ScenarioError(describe_validation_error(exc, str(p))) from exc


def load_builtin(name: str) -> Scenario:
    return load_scenario(builtin_path(name))
