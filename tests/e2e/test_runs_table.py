"""The runs table in Debian's Chromium: add a metric column, sort by it, filter, tick runs to compare."""

from __future__ import annotations

from urllib.parse import unquote

import pytest
from django.urls import reverse

from tests.e2e.browser import LiveBrowserTestCase
from tests.e2e.browser import artifacts as artifacts_dir
from tests.webapp.live import record_steps, running_run
from webapp.runs.models import MetricPoint, RunStatus


@pytest.mark.e2e
@pytest.mark.timeout(120)
class RunsTableInTheBrowser(LiveBrowserTestCase):
    serve_static = True

    def rows(self) -> list[str]:
        return self.page.eval_on_selector_all(
            "#run-table tbody tr[data-run]", "(rows) => rows.map((r) => r.dataset.run)"
        )

    def test_columns_sorting_filters_and_compare_from_the_table(self):
        first = running_run(self.owner, total_steps=10, status=RunStatus.SUCCEEDED)
        second = running_run(
            self.owner, total_steps=10, number=2, experiment=first.experiment, tags=["best"]
        )
        record_steps(first, range(1, 4))
        record_steps(second, range(1, 4))
        # The second run scores higher at its last step.
        MetricPoint.objects.filter(run=second, step=3).update(
            metrics={"critic/score/mean": 0.99, "actor/kl_loss": 0.5}
        )
        page = self.page
        page.goto(self.live_server_url + reverse("runs:list"))
        assert self.rows() == [str(second.pk), str(first.pk)]  # newest first

        page.fill("input[name=metric][list=metric-names]", "critic/score/mean")
        page.click("#table-form button[type=submit]")
        page.wait_for_selector("th[data-metric='critic/score/mean']")
        assert "metric=critic/score/mean" in unquote(page.url)
        cells = page.eval_on_selector_all(
            "#run-table tbody tr", "(rows) => rows.map((r) => r.cells[7].textContent)"
        )
        assert cells[0] == "0.99"
        page.click("th[data-metric='critic/score/mean'] a")  # last value, descending
        page.wait_for_url(lambda url: "sort=-last" in url)
        assert self.rows() == [str(second.pk), str(first.pk)]
        page.click("th[data-metric='critic/score/mean'] a")  # ascending
        page.wait_for_url(lambda url: "sort=last" in url)
        assert self.rows() == [str(first.pk), str(second.pk)]

        page.select_option("select[name=tag]", "best")
        page.click("#table-form button[type=submit]")
        page.wait_for_url(lambda url: "tag=best" in url)
        assert self.rows() == [str(second.pk)]
        assert "metric=critic/score/mean" in unquote(page.url)  # the columns stay with the filter
        page.goto(self.live_server_url + reverse("runs:list") + "?status=succeeded")
        assert self.rows() == [str(first.pk)]

        page.goto(self.live_server_url + reverse("runs:list"))
        page.check(f"input[name=run][value='{first.pk}']")
        page.check(f"input[name=run][value='{second.pk}']")
        page.screenshot(path=str(artifacts_dir() / "runs-table.png"), full_page=True)
        page.click("#compare-form button")
        page.wait_for_selector(".compare-legend")
        legend = page.inner_text(".compare-legend")
        assert f"run #{first.pk}" in legend and f"run #{second.pk}" in legend
        assert self.errors == []
