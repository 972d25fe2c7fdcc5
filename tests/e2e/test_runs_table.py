"""The runs table in Debian's Chromium: add a metric column, sort by it, filter, tick runs to compare."""

from __future__ import annotations

from urllib.parse import unquote

import pytest
from django.urls import reverse

from tests.e2e.browser import LiveBrowserTestCase
from tests.e2e.browser import artifacts as artifacts_dir
from tests.webapp.live import record_steps, running_run
from webapp.runs.models import MetricPoint, RunStatus
from webapp.runs.numbers import metric_text


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
            "#run-table tbody tr", "(rows) => rows.map((r) => r.cells[5].textContent)"
        )
        assert cells[0] == "0.99"
        last = "a[title='critic/score/mean: the last recorded value']"
        page.click(last)  # last value, descending
        page.wait_for_url(lambda url: "sort=-last" in url)
        assert self.rows() == [str(second.pk), str(first.pk)]
        page.click(last)  # ascending
        page.wait_for_url(lambda url: "sort=last" in url)
        assert self.rows() == [str(first.pk), str(second.pk)]

        page.select_option("select[name=tag]", "best")
        page.click("#table-form button[type=submit]")
        page.wait_for_url(lambda url: "tag=best" in url)
        assert self.rows() == [str(second.pk)]
        assert "metric=critic/score/mean" in unquote(page.url)  # the columns stay with the filter
        page.goto(self.live_server_url + reverse("runs:list") + "?status=succeeded")
        assert self.rows() == [str(first.pk)]
        # A status link names no columns: the member's own came with it.
        assert "metric=critic/score/mean" in unquote(page.url)

        page.goto(self.live_server_url + reverse("runs:list"))
        page.check(f"input[name=run][value='{first.pk}']")
        page.check(f"input[name=run][value='{second.pk}']")
        page.screenshot(path=str(artifacts_dir() / "runs-table.png"), full_page=True)
        page.click("#compare-form button")
        page.wait_for_selector(".compare-legend")
        legend = page.inner_text(".compare-legend")
        assert f"run #{first.pk}" in legend and f"run #{second.pk}" in legend
        assert self.errors == []

    def test_three_metric_and_three_config_columns_fit_a_1400_px_window_and_come_back(self):
        from tests.webapp.fixtures import make_experiment

        experiment = make_experiment(self.owner)
        run = running_run(
            self.owner,
            experiment=experiment,
            config=experiment.config,
            total_steps=10,
            status=RunStatus.SUCCEEDED,
        )
        record_steps(run, range(1, 4))
        page = self.page  # 1400 x 1000
        table = self.live_server_url + reverse("runs:list")
        page.goto(table)
        for name in ("critic/score/mean", "response_length/mean", "actor/entropy"):
            page.fill("input[name=metric][list=metric-names]", name)
            page.click("#table-form button[type=submit]")
            page.wait_for_selector(f"th[data-metric='{name}']")
        for key in ("actor_rollout_ref.actor.optim.lr", "actor_rollout_ref.rollout.n"):
            page.fill("input[name=col][list=config-keys]", key)
            page.click("#table-form button[type=submit]")
            page.wait_for_selector(f"th[data-config='{key}']")
        page.fill("input[name=col][list=config-keys]", "algorithm.adv_estimator")
        page.click("#table-form button[type=submit]")
        page.wait_for_selector("th[data-config='algorithm.adv_estimator']")
        widths = page.evaluate(
            "() => ({page: document.documentElement.scrollWidth, window: window.innerWidth,"
            " table: document.getElementById('run-table').getBoundingClientRect().right})"
        )
        assert widths["page"] <= widths["window"] and widths["table"] <= widths["window"], widths
        config = page.eval_on_selector_all(
            f"tr[data-run='{run.pk}'] [data-cell=config]",
            "(cells) => cells.map((c) => c.textContent)",
        )
        rollout, optim = (
            run.config["actor_rollout_ref"]["rollout"],
            run.config["actor_rollout_ref"]["actor"]["optim"],
        )
        assert config == [metric_text(optim["lr"]), str(rollout["n"]), "grpo"]
        page.screenshot(path=str(artifacts_dir() / "runs-table-columns.png"), full_page=True)

        # A bad config filter keeps the columns and what was typed, and names the problem.
        page.fill("#table-form input[name=config][placeholder]", "lr=1e-6")
        page.click("#table-form button[type=submit]")
        page.wait_for_selector("#table-errors")
        assert "'lr' is not a config key; did you mean" in page.inner_text("#table-errors")
        assert page.locator("#table-form input[name=config][value='lr=1e-6']").count() == 1
        assert page.locator("th[data-metric]").count() == 3
        assert page.locator("th[data-config]").count() == 3

        # The next visit from the menu opens with the same columns (kept on the server).
        page.goto(self.live_server_url + run.get_absolute_url())
        page.click("nav >> text=Runs")
        page.wait_for_selector("th[data-config='algorithm.adv_estimator']")
        assert page.locator("th[data-metric]").count() == 3
        assert self.errors == []
