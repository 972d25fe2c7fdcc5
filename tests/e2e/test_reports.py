"""A report in Debian's Chromium: saved from the compare page, its charts drawn (a run's line and
a group's band), notes with a ``<script>`` that never runs, and the downloaded HTML file drawing
the same charts offline with no request to any host."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.e2e.browser import LiveBrowserTestCase
from tests.e2e.browser import artifacts as artifacts_dir
from tests.webapp.fixtures import make_experiment
from tests.webapp.live import record_steps, running_run
from webapp.reports.models import Report
from webapp.runs.groups import run_groups_for_user
from webapp.runs.models import RunStatus

# Each chart's metric, its traces' names and whether one is filled (a band).
CHARTS = """() => [...document.querySelectorAll('.report-chart')].map((c) => ({
  metric: c.dataset.metric, names: (c.data || []).map((t) => t.name),
  band: (c.data || []).some((t) => t.fill === 'tonexty'),
  svg: !!c.querySelector('.main-svg'),
}))"""


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(120)
class ReportInTheBrowser(LiveBrowserTestCase):
    serve_static = True

    def test_a_report_saved_from_compare_draws_its_charts_here_and_offline(self):
        experiment = make_experiment(self.owner, name="grpo seeds")
        runs = []
        for seed in (1, 2):
            config = experiment.config | {"trainer": experiment.config["trainer"] | {"seed": seed}}
            run = running_run(
                self.owner,
                experiment=experiment,
                number=seed,
                config=config,
                status=RunStatus.SUCCEEDED,
            )
            record_steps(run, range(1, 21))
            runs.append(run)
        [group] = run_groups_for_user(user=self.owner)
        dialogs: list[str] = []
        page = self.page
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        compare = f"{reverse('runs:compare')}?run={runs[0].pk}&group={group.token}"
        page.goto(f"{self.live_server_url}{compare}")
        page.fill("#compare-save-report input[name=title]", "Seeds agree")
        page.click("#compare-save-report button[type=submit]")
        page.wait_for_selector("#report-charts[data-drawn=true]")
        report = Report.objects.get(title="Seeds agree")
        assert page.url == f"{self.live_server_url}{report.get_absolute_url()}"
        assert page.input_value("#report-edit textarea[name=metrics]") == "critic/score/mean"
        page.fill("#report-edit textarea[name=metrics]", "critic/score/mean\nactor/kl_loss")
        page.fill(
            "#report-edit textarea[name=notes]",
            "**Both seeds** agree.\n\n<script>alert('x')</script>",
        )
        page.click("#report-edit button[type=submit]")
        page.wait_for_selector("#report-charts[data-drawn=true]")
        charts = page.evaluate(CHARTS)
        assert [c["metric"] for c in charts] == ["critic/score/mean", "actor/kl_loss"]
        assert all(c["svg"] and c["band"] for c in charts)
        assert page.inner_html("#report-notes strong") == "Both seeds"
        assert "<script>alert('x')</script>" in page.inner_text("#report-notes")
        page.screenshot(path=str(artifacts_dir() / "report.png"), full_page=True)

        with page.expect_download() as download_info:
            page.click("#report-export")
        path = artifacts_dir() / "report-export.html"
        download_info.value.save_as(path)
        offline = self.browser.new_context(offline=True)
        try:
            requests: list[str] = []
            file_page = offline.new_page()
            file_page.on("request", lambda request: requests.append(request.url))
            file_page.on("pageerror", lambda error: self.errors.append(str(error)))
            file_page.on(
                "dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss())
            )
            file_page.goto(path.resolve().as_uri())
            file_page.wait_for_selector("#report-charts[data-drawn=true]")
            assert file_page.evaluate(CHARTS) == charts
            assert [url for url in requests if not url.startswith("file:")] == []
        finally:
            offline.close()
        assert dialogs == [] and self.errors == []
