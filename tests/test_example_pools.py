"""Every pool config in docs/examples (``*_pool.toml``) loads as it is documented, and
none of them holds a secret: keys are named by environment variable only."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from coordinator.runtime.pool import Pool, load_pool

EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples"
POOLS = sorted(EXAMPLES.glob("*_pool.toml"))


def test_the_documented_pools_are_there() -> None:
    assert {"endpoints_pool.toml", "azure_pool.toml"} <= {p.name for p in POOLS}


@pytest.mark.parametrize("path", POOLS, ids=[p.name for p in POOLS])
def test_an_example_pool_loads(path: Path) -> None:
    config = load_pool(path)
    assert config.candidates, f"{path.name} serves no role"
    assert Pool(config).by_role  # every role has its candidates
    text = path.read_text()
    assert not re.search(r"^\s*api_key\s*=", text, re.MULTILINE)  # only api_key_env
    for c in [*config.candidates, *config.evaluators]:
        if c.backend.kind in ("openai", "azure"):
            env = c.backend.settings.get("api_key_env")
            assert env is None or re.fullmatch(r"[A-Z][A-Z0-9_]*", env), (c.id, env)


def test_the_azure_pool_hedges_each_role_across_regions() -> None:
    config = load_pool(EXAMPLES / "azure_pool.toml")
    by_role = Pool(config).by_role
    assert sorted(by_role) == ["coder", "planner"]
    for role, candidates in by_role.items():
        assert {c.backend.kind for c in candidates} == {"azure"}, role
        assert len({c.zone for c in candidates}) == len(config.zones), role
    assert config.evaluator is not None and config.evaluator.candidate in {
        e.id for e in config.evaluators
    }
