"""What every real-browser test shares: Debian's Chromium, its launch flags, the screenshot folder.

Never ``playwright install`` (it downloads a browser): Playwright drives the system's Chromium
with the flags the web benchmarks use too (``bench.web.live_common`` defines both).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.web.live_common import CHROMIUM, CHROMIUM_ARGS


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


def in_driver_thread(run_id: int, record: Callable[[Any], None]) -> None:
    """Call ``record(recorder)`` with the driver's ``RunRecorder`` from another thread, over the
    channel layer, as a run's driver does (the browser test's own thread runs Playwright)."""
    import threading

    from channels.layers import channel_layers
    from django.db import connection

    from workers.publish import RunEventPublisher
    from workers.recorder import RunRecorder

    def drive() -> None:
        publisher = RunEventPublisher(channel_layers.make_backend("default"))
        try:
            record(RunRecorder(run_id, publisher))
        finally:
            publisher.close()
            connection.close()

    thread = threading.Thread(target=drive)
    thread.start()
    thread.join(30)
