"""The run page in Debian's Chromium when its run fails: the error and the resume button appear
without a reload (the driver's side goes through its ``RunRecorder`` from another thread)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from tests.e2e.browser import LiveBrowserTestCase, in_driver_thread
from tests.e2e.test_live_run_page import FIELDS
from tests.webapp.live import running_run, step_metrics


@pytest.mark.e2e
@pytest.mark.timeout(120)
class LiveRunFailureTest(LiveBrowserTestCase):
    def test_a_failure_shows_its_error_and_offers_the_resume_at_once(self):
        run = running_run(self.owner, total_steps=5, t0=timezone.now(), driver="pid:4242")
        page = self.page
        page.goto(self.live_server_url + run.get_absolute_url())
        page.wait_for_selector(".connection[data-state=live]")
        page.evaluate("window.__samePage = true")
        first = page.evaluate(FIELDS)
        assert first["error"] is None and first["resume"] is None and first["cancel"] == "Cancel"
        assert first["checkpoint"] == "none yet"

        def fail(recorder) -> None:
            recorder.on_checkpoint(1, "/tmp/checkpoints/global_step_1")
            recorder.on_step(1, step_metrics(1))
            recorder.on_finish(
                status="failed", error="Traceback (most recent call last):\nValueError: boom"
            )

        in_driver_thread(run.pk, fail)
        page.wait_for_function(f"() => ({FIELDS})().resume !== null", timeout=10000)
        fields = page.evaluate(FIELDS)
        assert fields["status"] == "failed" and fields["finished"] != "—"
        assert fields["error"].startswith("Error") and "ValueError: boom" in fields["error"]
        assert fields["cancel"] is None and fields["delete"] == "Delete"
        assert fields["checkpoint"] == "/tmp/checkpoints/global_step_1"
        assert page.is_enabled("[data-field=resume] button")  # a checkpoint to resume from
        assert page.evaluate("window.__samePage") is True
        assert self.errors == []
