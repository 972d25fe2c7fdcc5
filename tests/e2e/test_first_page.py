"""A first visit in Debian's Chromium: the login page and the first pages after it load without a
failed request (the browser's own /favicon.ico was one) or a console error."""

from __future__ import annotations

import pytest

from tests.e2e.browser import LiveBrowserTestCase


@pytest.mark.e2e
@pytest.mark.timeout(120)
class FirstPageTest(LiveBrowserTestCase):
    def test_the_first_pages_load_without_a_failed_request(self):
        failed: list[str] = []
        console: list[str] = []
        page = self.page
        page.on("response", lambda r: r.status >= 400 and failed.append(f"{r.status} {r.url}"))
        page.on("console", lambda m: m.type == "error" and console.append(m.text))
        for path in ("/", "/runs/", "/sweeps/", "/datasets/"):
            page.goto(self.live_server_url + path)
            page.wait_for_load_state("networkidle")
        page.context.clear_cookies()
        page.goto(self.live_server_url + "/accounts/login/")
        page.wait_for_load_state("networkidle")
        assert failed == [] and console == [] and self.errors == []
        icon = page.evaluate("() => document.querySelector('link[rel=icon]').href")
        assert icon == self.live_server_url + "/static/img/favicon.svg"
