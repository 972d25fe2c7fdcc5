"""The quick start in Debian's Chromium: a verl tutorial's YAML, imported into the builder.

``docs/quickstart.md`` walks through this page; the screenshot it shows is the one this test
takes (``$POSTTRAIN_TEST_ARTIFACTS/quickstart-import.png``, copied to ``docs/images/``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from tests.e2e.browser import CHROMIUM, SyncBrowserTestCase, artifacts, logged_in_page
from tests.engine.test_quickstart import YAML_SNIPPET


@pytest.mark.e2e
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")
class QuickstartInTheBrowser(SyncBrowserTestCase):
    serve_static = True

    def test_the_tutorial_yaml_opens_in_the_builder_with_verls_keys(self) -> None:
        from playwright.sync_api import expect

        user = get_user_model().objects.create_user("alice", password="alice-pass")
        self.client.force_login(user)
        session = self.client.cookies["sessionid"].value
        tutorial = YAML_SNIPPET.replace('name: "sglang"', 'name: "hf"').replace(
            'model: {path: ""', 'model: {path: "tiny://model"'
        )
        errors: list[str] = []
        with logged_in_page(
            self.live_server_url, session, errors, viewport={"width": 1400, "height": 1000}
        ) as page:
            page.goto(f"{self.live_server_url}/experiments/new/")
            page.click("details.import summary")
            page.fill("textarea[name=yaml_text]", tutorial)
            page.click("details.import button[type=submit]")
            # The tutorial's spellings arrive as verl's keys.
            expect(page.locator("[name=algorithm__adv_estimator]")).to_have_value("gae")
            expect(page.locator("[name=trainer__total_training_steps]")).to_have_value("1000")
            expect(page.locator("[name=trainer__save_freq]")).to_have_value("100")
            expect(page.locator("[name=actor_rollout_ref__actor__clip_ratio]")).to_have_value("0.2")
            expect(page.locator("[name=actor_rollout_ref__model__path]")).to_have_value(
                "tiny://model"
            )
            page.screenshot(path=str(artifacts() / "quickstart-import.png"), full_page=False)
            # The builder's script (an ES module) previews the YAML as a field changes.
            expect(page.locator("#yaml-preview")).to_contain_text("total_training_steps: 1000")
            page.fill("[name=trainer__total_training_steps]", "7")
            expect(page.locator("#yaml-preview")).to_contain_text("total_training_steps: 7")
        assert errors == []
