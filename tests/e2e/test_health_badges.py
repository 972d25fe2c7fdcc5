"""The run page in Debian's Chromium shows a health alert as it fires, with its step and reason.

The driver's side goes through its ``RunRecorder`` in another thread over the Redis layer, as in
``test_live_run_page``; the alert's event goes out when the step's transaction commits.
"""

from __future__ import annotations

import math

import pytest

from tests.e2e.browser import LiveBrowserTestCase, in_driver_thread
from tests.webapp.live import running_run

HEALTHY = {"actor/pg_loss": 0.01, "actor/entropy": 0.7, "critic/score/mean": 0.2}
ALERTS = """() => [...document.querySelectorAll("#run-health .health-alert")].map(
  (li) => [li.dataset.check, li.textContent.replace(/\\s+/g, " ").trim()])"""


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(120)
class HealthBadgeTest(LiveBrowserTestCase):
    def test_an_alert_appears_live_once_and_stays_after_a_reload(self):
        run = running_run(self.owner, total_steps=10)
        page = self.page
        page.goto(self.live_server_url + run.get_absolute_url())
        page.wait_for_selector(".connection[data-state=live]")
        assert page.is_hidden("#run-health")

        def steps(recorder) -> None:
            recorder.on_step(1, HEALTHY)
            recorder.on_step(2, HEALTHY | {"actor/pg_loss": math.nan})
            recorder.on_step(3, HEALTHY | {"actor/pg_loss": math.nan})

        in_driver_thread(run.pk, steps)
        page.wait_for_selector("#run-health .health-alert", state="visible", timeout=10000)
        page.wait_for_function("() => document.body.textContent.includes('(step 3)')")
        expected = [["non_finite_loss", "NaN/inf loss step 2 actor/pg_loss is nan"]]
        assert page.evaluate(ALERTS) == expected
        badge = page.locator("#run-health .health-badge")
        assert badge.get_attribute("title") == "actor/pg_loss is nan"
        assert badge.evaluate("(node) => getComputedStyle(node).display") == "inline-block"
        page.reload()
        page.wait_for_selector(".connection[data-state=live]")
        assert page.evaluate(ALERTS) == expected  # rendered by the server, not added twice
        assert self.errors == []
