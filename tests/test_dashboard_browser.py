"""The status page of `haco serve` (GET /dashboard) in headless Chromium, over a live stack
(tests/fleet.py: a worker for every zone but ``dark``): after a few invocations, the page
lists the pool's candidates, draws the zone-share chart and shows the hedge figures; its
data (GET /v1/dashboard) needs the bearer token, the page itself does not. The screenshot
goes to docs/dashboard.png."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from browser import chromium_page
from fleet import DARK, ROLES, SERVED, Fleet, fleet, traffic
from web import UvicornThread

from coordinator.api.app import create_app

TOKEN = "tok-dash"
DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.fixture(scope="module")
def served(
    runtime_redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Fleet]]:
    with fleet(runtime_redis_url, tmp_path_factory.mktemp("dash")) as f:
        settings = f.settings.model_copy(update={"api_tokens": TOKEN})
        with UvicornThread(create_app(settings, f.client)) as server:
            yield server.url, f


def test_the_data_needs_the_token_and_the_page_does_not(served: tuple[str, Fleet]) -> None:
    url, _ = served
    page = httpx.get(f"{url}/dashboard", timeout=30)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "<script" in page.text and "http://" not in page.text and "https://" not in page.text
    assert httpx.get(f"{url}/v1/dashboard", timeout=30).status_code == 401
    auth = {"authorization": f"Bearer {TOKEN}"}
    data = httpx.get(f"{url}/v1/dashboard", headers=auth, timeout=30).json()
    assert {p["candidate"] for p in data["profiles"]} == {c for m in ROLES.values() for c, *_ in m}
    assert {z["zone"]: z["status"] for z in data["zones"]}[DARK] == "missing"


def test_the_dashboard_in_chromium(served: tuple[str, Fleet]) -> None:
    url, f = served
    traffic(f.client, n=8)
    with chromium_page(width=1440, height=1200) as page:
        page.goto(f"{url}/dashboard#token={TOKEN}")
        page.wait_for_selector("body[data-loaded='1']", timeout=30_000)
        for _ in range(2):  # traffic between the polls: the rates chart draws a line
            traffic(f.client, n=4)
            page.wait_for_timeout(3_000)
        page.wait_for_function(
            "[...document.querySelectorAll('#rates path')]"
            ".some(p => /L/.test(p.getAttribute('d')))",
            timeout=30_000,
        )
        candidates = page.eval_on_selector_all(
            "#profiles tbody tr", "rows => rows.map(r => r.dataset.candidate)"
        )
        assert set(candidates) == {c for m in ROLES.values() for c, *_ in m}
        assert page.locator("#share svg rect").count() >= 1  # the zone-share bars
        legend = page.locator("#share-legend").inner_text()
        assert all(zone in legend for zone in [*SERVED, DARK])
        hedge = page.locator("#k-hedge").inner_text()
        assert hedge.endswith("%"), hedge
        assert page.locator("#k-bwin").inner_text().endswith("%")
        assert page.locator("#k-fail").inner_text().endswith("%")
        assert "/" in page.locator("#k-breq").inner_text()
        dark = page.locator(f"#zones tr[data-zone='{DARK}'] .pill").inner_text()
        assert dark == "missing"
        assert DARK in page.locator("#problems").inner_text()
        assert page.locator("#status").get_attribute("class") == "live"
        DOCS.mkdir(exist_ok=True)
        page.screenshot(path=str(DOCS / "dashboard.png"), full_page=True)
    assert (DOCS / "dashboard.png").stat().st_size > 10_000
