"""Headless Chromium for the browser tests, through Playwright's Python package and the
system's browser (Debian's ``chromium``: `make test` installs it with apt-get when
/usr/bin/chromium is missing; ``HACO_TEST_CHROMIUM`` names another binary). Playwright's
own browser download (``playwright install``) is never used."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

CHROMIUM = os.environ.get("HACO_TEST_CHROMIUM", "/usr/bin/chromium")


@contextlib.contextmanager
def chromium_page(width: int = 1400, height: int = 1000) -> Iterator[Page]:
    """A page of a fresh headless Chromium; the browser is closed afterwards."""
    if not Path(CHROMIUM).exists():
        raise RuntimeError(
            f"no Chromium at {CHROMIUM}: run `make test` (it installs Debian's chromium "
            "with apt-get) or `apt-get install -y chromium`, or set HACO_TEST_CHROMIUM"
        )
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            yield page
        finally:
            browser.close()
