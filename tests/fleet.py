"""A small fleet for the operator views (`haco zones`, the dashboard, Flower): a pool of
four zones over the fake OpenAI server of tests/fake_openai.py, a real worker process for
every zone but ``dark`` (deliberately left without one), task events on (Flower sees the
tasks), and a uvicorn thread for `haco serve`'s app."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fake_openai import FakeServer
from services import flush_runtime_dbs, wait_ready

from coordinator.config import HacoSettings
from coordinator.errors import HedgeError
from coordinator.runtime.client import HacoClient
from coordinator.services.supervisor import Stack, start_stack
from schemas.enums import WinnerMode

CALLER = "local"
ZONES = ["local", "regional", "global", "dark"]
DARK = "dark"
SERVED = [z for z in ZONES if z != DARK]
# role -> [(candidate id, zone, fake model behaviour)]
ROLES = {
    "coder": [
        ("c-local", "local", "ok"),
        ("c-regional", "regional", "ok"),
        ("c-global", "global", "500"),
    ],
    "writer": [("w-regional", "regional", "ok"), ("w-global", "global", "no-usage")],
    "lost": [("d-dark", DARK, "ok")],  # its only zone has no worker: it waits in the queue
}


@dataclass
class Fleet:
    stack: Stack
    client: HacoClient
    settings: HacoSettings
    fake: FakeServer
    state_dir: Path


def pool_file(folder: Path, server: FakeServer) -> Path:
    cands = ""
    for role, members in ROLES.items():
        for cid, zone, model in members:
            cands += f"""
[[candidates]]
id = "{cid}"
role = "{role}"
model = "{model}"
zone = "{zone}"
[candidates.backend]
kind = "openai"
[candidates.backend.settings]
base_url = "{server.url}/v1"
api_key_env = "HACO_TEST_KEY"
read_timeout_s = 10.0
"""
    path = folder / "fleet-pool.toml"
    path.write_text(f'caller_zone = "{CALLER}"\nzones = {ZONES!r}\n{cands}', encoding="utf-8")
    return path


@contextlib.contextmanager
def fleet(redis_url: str, folder: Path) -> Iterator[Fleet]:
    """The stack, its client ready (every served zone's worker answers a ping)."""
    fake = FakeServer().start()
    pool = pool_file(folder, fake)
    state_dir = folder / "state"
    with pytest.MonkeyPatch.context() as mp:
        for name in [n for n in os.environ if n.startswith("HACO_")]:
            mp.delenv(name)
        for name, value in {
            "HACO_POOL_FILE": str(pool), "HACO_TEST_KEY": "sk-test", "HACO_TASK_EVENTS": "1",
            "HACO_REDIS_URL": redis_url, "HACO_STATE_DIR": str(state_dir),
        }.items():  # fmt: skip
            mp.setenv(name, value)
        flush_runtime_dbs(redis_url)
        settings = HacoSettings()
        stack = start_stack(settings, SERVED)
        try:
            with HacoClient(settings, redis_url=stack.redis_url) as client:
                wait_ready(client, SERVED, 30.0)
                yield Fleet(stack, client, settings, fake, state_dir)
        finally:
            stack.stop()
            fake.stop()
            flush_runtime_dbs(redis_url)


def traffic(client: HacoClient, n: int = 6) -> None:
    """``n`` invocations of each served role (won, some with a failed member), then one of
    the role whose zone has no worker (its member stays queued: a deadline error)."""
    for _ in range(n):
        client.invoke("coder", "hello", deadline_s=20, winner_mode=WinnerMode.FIRST)
        client.invoke("writer", "hello", deadline_s=20, winner_mode=WinnerMode.FIRST)
    with contextlib.suppress(HedgeError):
        client.invoke("lost", "hello", deadline_s=0.5)
