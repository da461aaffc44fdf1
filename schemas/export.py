"""Export the models' JSON Schemas into ``schemas/json/`` (one file per model).

A test compares the committed files with a fresh export, so a model change that was
not exported fails CI: `haco schemas export` writes them, `--check` only compares.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel

from schemas.backends import AzureSettings, OpenAISettings
from schemas.models import (
    Candidate,
    GroupVerdict,
    HedgeDecision,
    MemberReport,
    MemberTask,
    MemberTrace,
    RoleInvocation,
    ZoneLink,
)
from schemas.pool import PoolConfig
from schemas.scenario import Scenario

MODELS: dict[str, type[BaseModel]] = {
    "candidate": Candidate,
    "zone_link": ZoneLink,
    "role_invocation": RoleInvocation,
    "hedge_decision": HedgeDecision,
    "member_trace": MemberTrace,
    "scenario": Scenario,
    "pool_config": PoolConfig,
    "member_task": MemberTask,
    "member_report": MemberReport,
    "group_verdict": GroupVerdict,
    "openai_backend_settings": OpenAISettings,
    "azure_backend_settings": AzureSettings,
}

JSON_DIR = Path(__file__).resolve().parent / "json"


def render() -> dict[str, str]:
    """File name → content of every schema, deterministic (sorted keys)."""
    return {
        f"{name}.schema.json": json.dumps(model.model_json_schema(), indent=2, sort_keys=True)
        + "\n"
        for name, model in MODELS.items()
    }


def export(directory: Path = JSON_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render().items():
        path = directory / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def drift(directory: Path = JSON_DIR) -> list[str]:
    """Names of schema files that are missing, stale or unexpected."""
    fresh = render()
    problems = []
    for name, text in fresh.items():
        path = directory / name
        if not path.exists():
            problems.append(f"{name}: missing")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{name}: differs from the model")
    for path in sorted(directory.glob("*.schema.json")):
        if path.name not in fresh:
            problems.append(f"{path.name}: no model exports it")
    return problems
