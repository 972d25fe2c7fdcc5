"""Sweeps in Debian's Chromium: mark a key in the builder, create the sweep, watch its members.

The builder's "sweep" button puts the field's key and value in the sweep's keys; Create sweep
posts the builder to the sweep view, which queues one run per member (to a Celery queue no
worker reads, so nothing starts). A member's steps then arrive from the driver's recorder in
another thread over the Redis layer: the sweep page's overlay draws the reward panel only, and
without a reload the table, the parallel-coordinates chart and the sweep's status follow the
members to their end.
"""

from __future__ import annotations

import re

import pytest
from django.utils import timezone

from tests.e2e.browser import PrivateStudioBrowserTestCase, in_driver_thread
from tests.e2e.browser import artifacts as artifacts_dir
from tests.webapp.live import step_metrics
from webapp.runs.driver_writes import run_claim_for_start, run_mark_running
from webapp.runs.models import Run, RunStatus
from webapp.runs.numbers import metric_text
from webapp.sweeps.models import Sweep

LR = "actor_rollout_ref.actor.optim.lr"


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(180)
class SweepBuilderTest(PrivateStudioBrowserTestCase):
    def test_a_key_marked_in_the_builder_becomes_a_sweep_whose_page_follows_its_members(self):
        page = self.page
        page.goto(self.live_server_url + "/experiments/new/?preset=grpo_tiny")
        page.fill("#id_name", "lr sweep")
        mark = page.locator(f'button.sweep-mark[data-sweep-key="{LR}"]')
        mark.click()
        assert mark.get_attribute("aria-pressed") == "true"
        params = page.locator("#id_sweep-params")
        value = page.locator(f"#id_{LR.replace('.', '__')}").input_value()
        assert params.input_value() == f"{LR}: [{value}]"
        assert page.locator("#sweep-builder").evaluate("(node) => node.open")
        params.fill(f"{LR}: [1e-6, 1e-5]")
        page.fill("#id_sweep-concurrency", "1")
        page.click("#sweep-create")
        page.wait_for_url(re.compile(r"/sweeps/\d+/$"))
        sweep = Sweep.objects.get()
        runs = [m.run for m in sweep.members.order_by("index")]
        assert [r.config["actor_rollout_ref"]["actor"]["optim"]["lr"] for r in runs] == [
            1e-6,
            1e-5,
        ]
        assert [r.status for r in runs] == [RunStatus.QUEUED, RunStatus.QUEUED]
        assert page.locator("tr[data-member]").count() == 2

        # The first member runs: its reward comes live to the overlay, the reward panel only.
        now = timezone.now()
        Run.objects.filter(pk=runs[0].pk).update(
            status=RunStatus.RUNNING, started_at=now, heartbeat_at=now
        )
        page.wait_for_function(
            "() => document.querySelectorAll('#compare-live .connection[data-state=live]').length"
        )
        in_driver_thread(
            runs[0].pk, lambda rec: [rec.on_step(s, step_metrics(s)) for s in (1, 2, 3)]
        )
        page.wait_for_function(
            "() => { const p = document.querySelector('[data-panel=score] .chart-plot');"
            " return p && p.data && p.data.some((t) => t.x.length === 3); }",
            timeout=10000,
        )
        panels = page.eval_on_selector_all(
            "#compare-live [data-panel]", "(nodes) => nodes.map((n) => n.dataset.panel)"
        )
        assert panels == ["score"]  # the members' kl, entropy and length stay off this page

        # No reload from here on: the table, the chart and the sweep's own status follow the
        # members (a stale page said "starting" and "2 active" after both had ended).
        from playwright.sync_api import expect

        first, second = page.locator('tr[data-member="1"]'), page.locator('tr[data-member="2"]')
        final = metric_text(step_metrics(3)["critic/score/mean"])
        expect(first.locator("[data-metric=reward-final]")).to_have_text(final)
        expect(first.locator("[data-cell=status]")).to_have_text("running")
        assert second.locator("[data-metric=reward-final]").text_content() == "—"
        parcoords_lines = (
            "() => { const g = document.getElementById('sweep-parcoords');"
            " return g && g.data && g.data[0].type === 'parcoords'"
            " && g.data[0].dimensions.at(-1).values.length; }"
        )
        page.wait_for_function(f"({parcoords_lines})() === 1")
        expect(page.locator("[data-sweep-field=parcoords-note]")).to_be_hidden()

        in_driver_thread(runs[0].pk, lambda rec: rec.on_finish(status="succeeded"))
        expect(first.locator("[data-cell=status]")).to_have_text("succeeded")
        expect(page.locator("[data-sweep-field=active]")).to_have_text(" · 1 active")

        def run_second(recorder) -> None:
            assert run_claim_for_start(run_id=runs[1].pk) is not None
            assert run_mark_running(run_id=runs[1].pk) is not None
            recorder.on_start(config={}, total_steps=2, start_step=0)
            for step in (1, 2):
                recorder.on_step(step, step_metrics(step))
            recorder.on_finish(status="succeeded")

        in_driver_thread(runs[1].pk, run_second)
        expect(second.locator("[data-cell=status]")).to_have_text("succeeded")
        expect(second.locator("[data-metric=reward-final]")).to_have_text(
            metric_text(step_metrics(2)["critic/score/mean"])
        )
        expect(page.locator("[data-sweep-field=status]")).to_have_text("finished")
        expect(page.locator("[data-sweep-field=cancel]")).to_be_hidden()
        expect(page.locator("[data-sweep-field=active]")).to_be_hidden()
        assert "succeeded" in second.locator(".run-progress-text").text_content()
        page.wait_for_function(f"({parcoords_lines})() === 2")
        page.screenshot(path=str(artifacts_dir() / "sweep_page.png"), full_page=True)
        assert self.errors == []
