"""The run page in Debian's Chromium: the reward chart gains points as the driver records steps.

A live Daphne server (another process) serves the real ASGI app; steps are recorded from another
thread through the driver's ``RunRecorder`` and ``RunEventPublisher`` over the Redis layer.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from tests.e2e.browser import LiveBrowserTestCase, in_driver_thread
from tests.e2e.browser import artifacts as artifacts_dir
from tests.webapp.live import T0, record_steps, running_run, step_metrics
from webapp.runs.numbers import metric_text

# The number of points in the raw trace of one metric in one panel.
TRACE_POINTS = """([panel, name, source]) => {
  const grid = window.postTrainCharts;
  const p = grid && grid.panels.get(panel);
  if (!p || !p.plot.data) return 0;
  const i = p.traces.findIndex((t) => t.name === name && !t.smoothed && (source === undefined || t.source === source));
  return i < 0 ? 0 : p.plot.data[i].x.length;
}"""


def record_in_driver_thread(run_id: int, steps: range, finish: str | None = None) -> None:
    """Record ``steps`` (and an end state) from another thread, as the run driver would."""

    def record(recorder) -> None:
        for step in steps:
            recorder.on_step(step, step_metrics(step))
        if finish:
            recorder.on_finish(status=finish)

    in_driver_thread(run_id, record)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(180)
class LiveChartsTest(LiveBrowserTestCase):
    def test_the_reward_chart_gains_points_without_a_reload(self):
        t0 = timezone.now() - timedelta(seconds=60)
        run = running_run(self.owner, total_steps=40, t0=t0)
        record_steps(run, range(1, 6), t0=t0)
        page = self.page
        page.goto(self.live_server_url + run.get_absolute_url())
        page.wait_for_function(TRACE_POINTS, arg=["score", "critic/score/mean"], timeout=20000)
        assert page.evaluate(TRACE_POINTS, ["score", "critic/score/mean"]) == 5
        page.wait_for_selector(".connection[data-state=live]")
        page.evaluate("window.__samePage = true")

        record_in_driver_thread(run.pk, range(6, 13))
        page.wait_for_function(
            f"(args) => ({TRACE_POINTS})(args) === 12",
            arg=["score", "critic/score/mean"],
            timeout=15000,
        )
        assert page.evaluate("window.__samePage") is True  # no reload
        kl = page.evaluate(
            "() => { const p = window.postTrainCharts.panels.get('kl'); return p.plot.data[p.traces.findIndex((t) => !t.smoothed)].y; }"
        )
        assert kl == [step_metrics(s)["actor/kl_loss"] for s in range(1, 13)]
        assert "step 12 / 40" in page.inner_text("#run-live .run-progress-text")
        panels = page.eval_on_selector_all(
            ".chart-panel", "(nodes) => nodes.map((n) => n.dataset.panel)"
        )
        assert panels == ["score", "kl", "entropy", "response_length", "timing"]
        page.screenshot(path=str(artifacts_dir() / "live-charts.png"), full_page=True)

        # The browser's own arithmetic: smoothing, zoom merging and the store's step order.
        checks = page.evaluate(
            """async () => {
              const {ema, mergeRange, SeriesStore} = await import("/static/js/stream.js");
              const store = new SeriesStore();
              store.replace({a: {step: [1, 2], time: [10, 20], value: [0.5, 0.25]}}, 2);
              const added = store.append([
                {step: 2, time: 20, metrics: {a: 9}},
                {step: 3, time: 30, metrics: {a: 1, b: null}},
              ]);
              const coarse = {step: [1, 5, 9], time: [1, 5, 9], value: [1, 5, 9]};
              const fine = {step: [4, 5, 6], time: [4, 5, 6], value: [4, 5.5, 6]};
              return {
                flat: ema([1, 1, 1], 0.6),
                ramp: ema([0, 1], 0.5),
                merged: mergeRange(coarse, fine, 4, 6).value,
                added: added.map((p) => [p.name, p.step, p.value]),
              };
            }"""
        )
        assert checks == {
            "flat": [1, 1, 1],
            "ramp": [0, 0.666666666667],  # (0.5 * 1) / (1 - 0.5 ** 2), to 12 digits
            "merged": [1, 4, 5.5, 6, 9],
            "added": [["a", 3, 1]],
        }

        # The connection drops; steps land meanwhile; the page catches up with ?since=12.
        page.evaluate("window.postTrainStream.socket.close()")
        record_in_driver_thread(run.pk, range(13, 16))
        page.wait_for_function(
            f"(args) => ({TRACE_POINTS})(args) === 15", arg=["score", "critic/score/mean"]
        )
        page.wait_for_selector(".connection[data-state=live]")
        steps = page.evaluate(
            "() => { const p = window.postTrainCharts.panels.get('kl'); return p.plot.data[p.traces.findIndex((t) => !t.smoothed)].x; }"
        )
        assert steps == list(range(1, 16))  # each step once, in order
        assert "since=12" in page.evaluate("window.postTrainStream.socket.url").split("?")[1].split(
            "&"
        )

        record_in_driver_thread(run.pk, range(16, 17), finish="succeeded")
        page.wait_for_function(
            "() => document.querySelector('#run-live .run-progress-text').textContent.endsWith('succeeded')",
            timeout=15000,
        )
        assert self.errors == []

    def test_a_learning_rate_of_1e_6_reads_as_1e_6_in_the_table_and_on_its_axis(self):
        run = running_run(self.owner, total_steps=10)
        page = self.page
        page.goto(self.live_server_url + run.get_absolute_url())
        page.wait_for_selector(".connection[data-state=live]")

        def record(recorder, steps=range(1, 4), lr=1e-6):
            for step in steps:
                recorder.on_step(step, {**step_metrics(step), "actor/lr": lr})

        in_driver_thread(run.pk, record)
        lr_points = ["metric:actor/lr", "actor/lr"]
        page.wait_for_function(f"(args) => ({TRACE_POINTS})(args) === 3", arg=lr_points)
        # A constant 1e-6 was a flat line at 0 on Plotly's -1..1 axis: the axis fits the value.
        y_axis = "() => window.postTrainCharts.panels.get('metric:actor/lr').plot.layout.yaxis"
        axis = page.evaluate(y_axis)
        assert axis["range"] == [pytest.approx(5e-7), pytest.approx(1.5e-6)]
        assert axis["autorange"] is False
        row = page.locator("#latest-metrics tr", has=page.locator("th", has_text="actor/lr"))
        assert row.locator("td").inner_text() == "1e-6"
        # The warmup moves on: the axis fits the values again.
        in_driver_thread(run.pk, lambda recorder: record(recorder, range(4, 5), 2e-6))
        page.wait_for_function(f"(args) => ({TRACE_POINTS})(args) === 4", arg=lr_points)
        page.wait_for_function(f"() => ({y_axis})().autorange === true")
        assert row.locator("td").inner_text() == "2e-6"

        # The live table prints every value as the server's first paint does.
        values = [1e-6, 2.345e-5, -3e-4, 9.996e-6, 0.001234, 0.8125, 1 / 3, 12.3456, 1234.56]
        values += [123456.789, 0.5, 16.0, 0.0, 1e20, 12.125, -0.25, 1.005, 0.0009999, None]
        browser = page.evaluate(
            """async (values) => {
              const {formatMetric} = await import("/static/js/numbers.js");
              return values.map(formatMetric);
            }""",
            values,
        )
        assert browser == [metric_text(v) for v in values]
        assert self.errors == []

    def test_zoom_refines_and_the_toolbar_redraws_the_panels(self):
        run = running_run(self.owner, total_steps=4000)
        record_steps(run, range(1, 3001))
        page = self.page
        page.goto(self.live_server_url + run.get_absolute_url())
        page.wait_for_function(TRACE_POINTS, arg=["kl", "actor/kl_loss"], timeout=20000)
        assert page.evaluate(TRACE_POINTS, ["kl", "actor/kl_loss"]) <= 1500  # downsampled

        in_range = """() => {
          const p = window.postTrainCharts.panels.get("kl");
          const t = p.plot.data[p.traces.findIndex((t) => !t.smoothed)];
          return t.x.filter((x) => x >= 100 && x <= 300).length;
        }"""
        page.evaluate(
            "() => Plotly.relayout(window.postTrainCharts.panels.get('kl').plot, {'xaxis.range': [100, 300]})"
        )
        page.wait_for_function(f"() => ({in_range})() === 201", timeout=15000)

        raw_traces = "() => window.postTrainCharts.panels.get('score').plot.data.length"
        before = page.evaluate(raw_traces)
        page.fill("[name=smoothing]", "0")
        page.wait_for_function(f"() => ({raw_traces})() === {before // 2}")
        page.check("[name=log]")
        page.wait_for_function(
            "() => window.postTrainCharts.panels.get('entropy').plot.layout.yaxis.type === 'log'"
        )
        page.select_option("[name=xaxis]", "time")
        page.wait_for_function(
            "() => window.postTrainCharts.panels.get('entropy').plot.layout.xaxis.type === 'date'"
        )
        first_x = page.evaluate(
            "() => window.postTrainCharts.panels.get('entropy').plot.data[0].x[0]"
        )
        assert first_x == (T0 + timedelta(seconds=1)).timestamp() * 1000
        with page.expect_download() as download:
            page.click("[data-panel=entropy] .chart-png")
        assert download.value.suggested_filename == f"run-{run.pk}-entropy.png"
        assert self.errors == []

    def test_the_comparison_overlays_two_runs_and_follows_the_live_one(self):
        t0 = timezone.now() - timedelta(seconds=60)
        first = running_run(self.owner, total_steps=40, t0=t0)
        second = running_run(
            self.owner, total_steps=40, number=2, experiment=first.experiment, t0=t0
        )
        record_steps(first, range(1, 31), t0=t0)
        record_steps(second, range(1, 4), t0=t0)
        page = self.page
        page.goto(f"{self.live_server_url}{reverse('runs:compare')}?run={first.pk}&run={second.pk}")
        for run, count in ((first, 30), (second, 3)):
            page.wait_for_function(
                f"(args) => ({TRACE_POINTS})(args) === {count}",
                arg=["score", "critic/score/mean", run.pk],
                timeout=20000,
            )
        legend = page.inner_text(".compare-legend")
        assert (
            f"tiny grpo · run #{first.pk}" in legend and f"tiny grpo · run #{second.pk}" in legend
        )
        record_in_driver_thread(second.pk, range(4, 8))
        page.wait_for_function(
            f"(args) => ({TRACE_POINTS})(args) === 7",
            arg=["score", "critic/score/mean", second.pk],
            timeout=15000,
        )
        page.screenshot(path=str(artifacts_dir() / "compare-runs.png"), full_page=True)
        assert self.errors == []

    def test_the_trace_builders_are_pure_functions_of_the_series(self):
        page = self.page
        page.goto(f"{self.live_server_url}{reverse('runs:compare')}")
        one_run = page.evaluate(
            """async () => {
              const {panelTraces} = await import("/static/js/traces.js");
              const series = {
                "critic/score/mean": {step: [1, 2], time: [10, 11], value: [1, 3]},
                "critic/score/max": {step: [1, 2], time: [10, 11], value: [2, 4]},
              };
              const input = {sources: [{id: 7, label: "run 7", series}],
                             names: ["critic/score/mean", "critic/score/max"], smoothing: 0.5};
              const before = JSON.stringify(input);
              const {traces, index, ema} = panelTraces(input);
              return {traces, index, ema: [...ema.keys()], untouched: JSON.stringify(input) === before};
            }"""
        )
        traces, index = one_run["traces"], one_run["index"]
        assert one_run["untouched"]
        assert [(t["name"], t["x"], t["y"]) for t in traces] == [
            ("mean", [1, 2], [1, 3]),
            ("mean", [1, 2], [1, pytest.approx(7 / 3)]),  # TensorBoard's debiased EMA
            ("max", [1, 2], [2, 4]),
            ("max", [1, 2], [2, pytest.approx(10 / 3)]),
        ]
        # One source: colours by the metric's place in the panel, the palette's first two.
        assert [t["line"]["color"] for t in traces] == ["#d3542f"] * 2 + ["#2f5bd3"] * 2
        assert [t["line"]["dash"] for t in traces] == ["solid", "solid", "dot", "dot"]
        raw, smooth = traces[0], traces[1]
        assert raw["opacity"] == 0.3 and raw["showlegend"] is False
        assert raw["customdata"] == [1, 2] and raw["hovertemplate"].startswith("mean<br>step")
        assert smooth["hoverinfo"] == "skip" and "opacity" not in smooth
        assert [(i["name"], i["smoothed"], i["drawn"]) for i in index] == [
            ("critic/score/mean", False, 2),
            ("critic/score/mean", True, 2),
            ("critic/score/max", False, 2),
            ("critic/score/max", True, 2),
        ]
        assert one_run["ema"] == ["7:critic/score/mean", "7:critic/score/max"]

        two_runs = page.evaluate(
            """async () => {
              const {panelTraces} = await import("/static/js/traces.js");
              const kl = {step: [5, 6], time: [100, 101.5], value: [0.1, 0.2]};
              return panelTraces({
                sources: [{id: 1, label: "grpo #1", color: "#123456", series: new Map([["actor/kl_loss", kl]])},
                          {id: 2, label: "grpo #2", color: "#abcdef", series: {}}],
                names: ["actor/kl_loss"], smoothing: 0, x: "time", type: "scattergl",
              }).traces;
            }"""
        )
        # Without smoothing one raw line per series; a run without the metric draws nothing.
        assert len(two_runs) == 1
        trace = two_runs[0]
        assert trace["name"] == "grpo #1 · actor/kl_loss" and trace["type"] == "scattergl"
        assert trace["x"] == [100000, 101500] and trace["customdata"] == [5, 6]
        assert trace["line"] == {"width": 1.6, "dash": "solid", "color": "#123456"}
        assert "opacity" not in trace and "showlegend" not in trace
        assert self.errors == []
