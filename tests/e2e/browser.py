"""What every real-browser test shares: Debian's Chromium, its launch flags, the screenshot folder.

Never ``playwright install`` (it downloads a browser): Playwright drives the system's Chromium
with these flags (no sandbox in a container, no GPU, nothing fetched in the background).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def artifacts() -> Path:
    """Return the folder for screenshots: ``$POSTTRAIN_TEST_ARTIFACTS`` or ``test-artifacts/``."""
    folder = Path(os.environ.get("POSTTRAIN_TEST_ARTIFACTS") or "test-artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextmanager
def logged_in_page(
    live_server_url: str, session: str, errors: list[str], **context: Any
) -> Iterator[Any]:
    """Yield a Chromium page holding ``session``'s login cookie; page errors land in ``errors``.

    ``context`` goes to ``new_context`` (a viewport, say). The browser closes on the way out.
    """
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            browser_context = browser.new_context(**context)
            browser_context.add_cookies(
                [{"name": "sessionid", "value": session, "url": live_server_url}]
            )
            page = browser_context.new_page()
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            yield page
        finally:
            browser.close()
