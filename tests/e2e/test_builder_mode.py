"""The builder's training mode in Debian's Chromium: the staleness boxes and partial rollout show
only for the fully-asynchronous mode, and the preview shows the verl keys each mode writes."""

from __future__ import annotations

import pytest

from tests.e2e.browser import LiveBrowserTestCase

THRESHOLD = "#id_async_training__staleness_threshold"
PARTIAL = "#id_async_training__partial_rollout"


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(120)
class BuilderModeTest(LiveBrowserTestCase):
    def test_picking_fully_async_shows_the_staleness_settings_and_writes_verls_keys(self):
        from playwright.sync_api import expect

        page = self.page
        page.goto(self.live_server_url + "/experiments/new/?preset=grpo_tiny")
        expect(page.locator("#id_training_mode_0")).to_be_checked()  # synchronous
        expect(page.locator(THRESHOLD)).to_be_hidden()
        preview = page.locator("#yaml-preview")

        page.check("input[name=training_mode][value=fully_async]")
        expect(page.locator(THRESHOLD)).to_be_visible()
        page.fill(THRESHOLD, "0.5")
        expect(preview).to_contain_text("hybrid_engine: false")
        expect(preview).to_contain_text("staleness_threshold: 0.5")
        page.select_option(PARTIAL, "true")
        expect(preview).to_contain_text("partial_rollout: true")

        page.check("input[name=training_mode][value=one_step_off]")
        expect(page.locator(THRESHOLD)).to_be_hidden()
        expect(preview).not_to_contain_text("staleness_threshold")
        expect(preview).not_to_contain_text("partial_rollout: true")
        expect(preview).to_contain_text("hybrid_engine: false")
        assert self.errors == []
