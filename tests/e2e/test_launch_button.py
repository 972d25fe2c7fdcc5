"""The launch button in Debian's Chromium: a double click sends one POST and says "Launching…".

The browser answers the POST itself (``page.route``, a 204 that leaves the page in place), so no
run is created and no task message is sent; what is under test is the page's own script.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from tests.e2e.browser import CHROMIUM, SyncBrowserTestCase, logged_in_page
from tests.webapp.fixtures import make_experiment


@pytest.mark.e2e
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")
class LaunchButtonInTheBrowser(SyncBrowserTestCase):
    serve_static = True

    def test_a_double_click_sends_one_launch_with_the_forms_key(self) -> None:
        from playwright.sync_api import expect

        user = get_user_model().objects.create_user("alice", password="alice-pass")
        experiment = make_experiment(user)
        self.client.force_login(user)
        errors: list[str] = []
        posts = []

        def answer(route) -> None:
            posts.append(route.request.post_data)
            route.fulfill(status=204)

        with logged_in_page(
            self.live_server_url, self.client.cookies["sessionid"].value, errors
        ) as page:
            page.route("**/launch/", answer)
            page.goto(f"{self.live_server_url}{experiment.get_absolute_url()}")
            key = page.locator("input[name=launch_key]").input_value()
            page.get_by_role("button", name="Launch a run").dblclick()
            button = page.locator("form[data-busy-label] button")
            expect(button).to_have_text("Launching…")
            expect(button).to_be_disabled()
            page.wait_for_timeout(300)  # time for a second POST, were one sent
        assert len(posts) == 1 and f"launch_key={key}" in posts[0]
        assert errors == []
