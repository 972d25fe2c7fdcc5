"""A seed group on the compare page in Debian's Chromium: its band, the band toggle, the members
listed on hover, and the band following a running member's new step."""

from __future__ import annotations

import pytest
from django.db import connection
from django.urls import reverse

from tests.e2e.browser import LiveBrowserTestCase, in_driver_thread
from tests.e2e.browser import artifacts as artifacts_dir
from tests.webapp.fixtures import make_experiment
from tests.webapp.live import record_steps, running_run, step_metrics
from webapp.runs.groups import run_groups_for_user
from webapp.runs.models import RunStatus

# The score panel's traces of the group's critic/score/mean: lower edge, upper edge, mean line.
BAND = """(name) => {
  const plot = window.postTrainCharts.panels.get("score").plot;
  const i = plot.data.findIndex((t) => t.name.endsWith(`· ${name}`) && t.customdata);
  const [lower, upper, mean] = plot.data.slice(i - 2, i + 1);
  return {
    fill: upper.fill, lower: lower.y, upper: upper.y, mean: mean.customdata.map((c) => c[1]),
    std: mean.customdata.map((c) => c[4]), n: mean.customdata.map((c) => c[5]), steps: mean.x,
    fills: plot.querySelectorAll(".scatterlayer .js-fill").length,
  };
}"""

# Where the mean line's point at `step` is on screen.
POINT = """(step) => {
  const plot = window.postTrainCharts.panels.get("score").plot;
  const mean = plot.data.find((t) => t.name.endsWith("· mean") && t.customdata);
  const k = mean.x.indexOf(step);
  const layout = plot._fullLayout;
  const box = plot.querySelector(".nsewdrag").getBoundingClientRect();
  return {x: box.left + layout.xaxis.l2p(mean.x[k]), y: box.top + layout.yaxis.l2p(mean.y[k])};
}"""


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(120)
class SeedGroupInTheBrowser(LiveBrowserTestCase):
    serve_static = True

    def test_the_band_renders_toggles_lists_members_on_hover_and_follows_a_member(self):
        experiment = make_experiment(self.owner)
        runs = []
        for seed, steps in ((1, 12), (2, 10), (3, 8)):
            config = experiment.config | {"trainer": experiment.config["trainer"] | {"seed": seed}}
            run = running_run(
                self.owner,
                experiment=experiment,
                number=seed,
                config=config,
                status=RunStatus.RUNNING if seed == 3 else RunStatus.SUCCEEDED,
            )
            record_steps(run, range(1, steps + 1))
            with connection.cursor() as cursor:  # seed s scores 0.1 * (s - 2) off the curve
                cursor.execute(
                    "UPDATE runs_metricpoint SET metrics = jsonb_set(metrics, "
                    "'{critic/score/mean}', to_jsonb((metrics->>'critic/score/mean')::float8 + %s))"
                    " WHERE run_id = %s",
                    [0.1 * (seed - 2), run.pk],
                )
            runs.append(run)
        [group] = run_groups_for_user(user=self.owner)
        page = self.page
        page.goto(f"{self.live_server_url}{reverse('runs:compare')}?group={group.token}")
        page.wait_for_function(  # the score first, then every series (more panels)
            "() => window.postTrainCharts?.panels.get('score')?.plot.data?.some((t) => t.fill)"
            " && window.postTrainCharts.panels.size >= 5"
        )
        page.fill("input[name=smoothing]", "0")  # the band's own values, unsmoothed
        page.wait_for_function(
            "() => window.postTrainCharts.options.smoothing === 0 && !window.postTrainCharts.frame"
        )
        band = page.evaluate(BAND, "mean")
        assert band["fill"] == "tonexty" and band["fills"] >= 1
        assert band["steps"] == list(range(1, 13))
        assert band["n"] == [3] * 8 + [2] * 2 + [1] * 2
        score = [step_metrics(s)["critic/score/mean"] for s in range(1, 13)]
        offsets = [(-0.1, 0.1)] * 8 + [(-0.1, 0.0)] * 2 + [(-0.1, -0.1)] * 2  # members left
        edges = list(zip(score, offsets, strict=True))
        assert band["lower"] == pytest.approx([v + lo for v, (lo, _) in edges])
        assert band["upper"] == pytest.approx([v + hi for v, (_, hi) in edges])
        assert band["mean"][:8] == pytest.approx(score[:8])

        page.select_option("select[name=band]", "std")
        page.wait_for_function(
            "() => window.postTrainCharts.options.band === 'std' && !window.postTrainCharts.frame"
        )
        std = page.evaluate(BAND, "mean")
        plus = [m + s for m, s in zip(std["mean"], std["std"], strict=True)]
        assert std["upper"] == pytest.approx(plus)

        page.evaluate("() => document.getElementById('compare-live').scrollIntoView()")
        point = page.evaluate(POINT, 4)
        page.mouse.move(point["x"], point["y"])
        hover = page.wait_for_selector(".hoverlayer .hovertext", timeout=10_000)
        text = hover.text_content()
        members = ", ".join(f"#{r.pk} (seed {n})" for n, r in enumerate(runs, 1))
        assert "3 of 3 members" in text
        assert members in text.replace("\xa0", " ")
        page.screenshot(path=str(artifacts_dir() / "seed_group_band.png"))

        in_driver_thread(
            runs[2].pk, lambda recorder: recorder.on_step(9, {"critic/score/mean": 5.0})
        )
        page.wait_for_function(f"() => ({BAND})('mean').n[8] === 3", timeout=15_000)
        after = page.evaluate(BAND, "mean")
        assert after["upper"][8] > 3  # mean ± std now reaches towards the new 5.0
        assert self.errors == []
