"""An asynchronous run's page in Debian's Chromium: the Async panels, and the trainer's wait
drawn both in the timing breakdown and beside the rollout worker's time, live."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.e2e.browser import LiveBrowserTestCase, in_driver_thread
from tests.e2e.test_live_charts import TRACE_POINTS
from tests.webapp.live import running_run, step_metrics
from webapp.runs.models import MetricPoint


def async_metrics(step: int) -> dict[str, float]:
    """Return a one-step-off step's metrics: the tiny GRPO step's and the async ones."""
    return {
        **step_metrics(step),
        "timing_s/step": 1.0,
        "timing_s/update_actor": 0.5,
        "timing_s/rollout_worker_gen": 0.75,
        "async/staleness_mean": float(step > 1),
        "async/staleness_max": float(step > 1),
        "async/rollout_policy_version": float(max(step - 2, 0)),
    }


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(120)
class AsyncChartsTest(LiveBrowserTestCase):
    def test_the_async_panels_draw_the_backlog_and_follow_the_live_steps(self):
        t0 = timezone.now() - timedelta(seconds=60)
        run = running_run(self.owner, total_steps=20, t0=t0)
        MetricPoint.objects.bulk_create(
            MetricPoint(
                run=run, step=s, wall_time=t0 + timedelta(seconds=s), metrics=async_metrics(s)
            )
            for s in range(1, 4)
        )
        page = self.page
        page.goto(self.live_server_url + run.get_absolute_url())
        # A panel off screen is drawn when it shows.
        page.wait_for_selector("[data-panel=async_time]", timeout=20000)
        page.locator("[data-panel=async_time]").scroll_into_view_if_needed()
        page.wait_for_function(TRACE_POINTS, arg=["async_time", "timing_s/gen"], timeout=20000)
        panels = page.eval_on_selector_all(
            ".chart-panel", "(nodes) => nodes.map((n) => n.dataset.panel)"
        )
        assert {"async_staleness", "async_version", "async_time", "timing"} <= set(panels)
        for panel, name in [
            ("async_time", "timing_s/gen"),
            ("async_time", "timing_s/rollout_worker_gen"),
            ("timing", "timing_s/gen"),
            ("async_staleness", "async/staleness_max"),
        ]:
            page.locator(f"[data-panel={panel}]").scroll_into_view_if_needed()
            page.wait_for_function(f"(args) => ({TRACE_POINTS})(args) === 3", arg=[panel, name])
        page.wait_for_selector(".connection[data-state=live]")

        # A live step reaches the trainer's wait in both panels that draw it.
        in_driver_thread(run.pk, lambda rec: [rec.on_step(s, async_metrics(s)) for s in (4, 5)])
        for panel in ("async_time", "timing"):
            page.locator(f"[data-panel={panel}]").scroll_into_view_if_needed()
            page.wait_for_function(
                f"(args) => ({TRACE_POINTS})(args) === 5",
                arg=[panel, "timing_s/gen"],
                timeout=15000,
            )
        assert self.errors == []
