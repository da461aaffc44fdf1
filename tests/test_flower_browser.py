"""Flower (`haco up --flower`'s command, coordinator.services.flower.flower_argv) over a
live stack whose workers send task events (tests/fleet.py), in headless Chromium: every
worker is on /workers and every queue a worker consumes is on /broker. The zone left
without a worker (``dark``) is not: Flower lists only queues some online worker consumes,
which is why `haco zones` and the dashboard flag it. The screenshot goes to
docs/flower.png."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from browser import chromium_page
from fleet import DARK, SERVED, Fleet, fleet, traffic
from playwright.sync_api import Page
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from polling import wait_for
from web import free_port

from coordinator.services.flower import flower_argv
from coordinator.state.keys import queue_for

DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.fixture(scope="module")
def flower(
    runtime_redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Fleet]]:
    folder = tmp_path_factory.mktemp("flower")
    with fleet(runtime_redis_url, folder) as f:
        port = free_port()
        log = (folder / "flower.log").open("wb")
        proc = subprocess.Popen(
            flower_argv(f.stack.redis_url, port), env=f.stack.env(), stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:

            def up() -> bool:
                assert proc.poll() is None, (folder / "flower.log").read_text()
                try:
                    return httpx.get(f"{url}/healthcheck", timeout=2).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_for("Flower to answer", up, 60.0)
            yield url, f
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()


def shows(page: Page, url: str, needles: list[str]) -> bool:
    """Whether ``url`` (reloaded each time: Flower's view refreshes) shows every needle
    within a few seconds (its tables are filled by script, from JSON)."""
    page.goto(url)
    try:
        page.wait_for_function(
            "needles => needles.every(n => document.body.textContent.includes(n))",
            arg=needles, timeout=5_000,
        )  # fmt: skip
    except PlaywrightTimeout:
        return False
    return True


def test_flower_shows_every_worker_and_every_consumed_queue(flower: tuple[str, Fleet]) -> None:
    url, f = flower
    traffic(f.client, n=3)  # task events: the tasks page has member tasks
    host = socket.gethostname()
    workers = [f"haco-{zone}@{host}" for zone in SERVED]
    queues = [queue_for(zone) for zone in SERVED]
    with chromium_page(width=1400, height=900) as page:
        wait_for("Flower's broker page to list the zone queues",
                 lambda: shows(page, f"{url}/broker", queues), 60.0, interval_s=1.0)  # fmt: skip
        assert queue_for(DARK) not in page.locator("body").text_content()
        wait_for("Flower's workers page to list every worker",
                 lambda: shows(page, f"{url}/workers", workers), 60.0, interval_s=1.0)  # fmt: skip
        rows = page.locator("#workers-table tbody tr").all_text_contents()
        assert all(any(w in r for r in rows) for w in workers), rows
        assert DARK not in " ".join(rows)
        DOCS.mkdir(exist_ok=True)
        page.wait_for_timeout(1_000)  # the overview counters settle
        page.screenshot(path=str(DOCS / "flower.png"), full_page=True)
        assert shows(page, f"{url}/tasks", ["haco.member"])
    assert (DOCS / "flower.png").stat().st_size > 10_000
