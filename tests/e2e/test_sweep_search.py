"""A searching sweep's page in Debian's Chromium: a member the pruner stops shows as pruned with
its reason, the best member so far and a member the search draws later appear without a reload.

The members' steps arrive from the driver's recorder in another thread over the Redis layer, as
a run's driver sends them; the start messages go to a queue no worker reads.
"""

from __future__ import annotations

import pytest
from django.utils import timezone

from tests.e2e.browser import PrivateStudioBrowserTestCase, in_driver_thread
from tests.e2e.browser import artifacts as artifacts_dir
from tests.webapp.fixtures import make_experiment
from webapp.runs.driver_writes import metric_point_upsert
from webapp.runs.models import Run, RunStatus
from webapp.sweeps.services import sweep_advance, sweep_create

LR = "actor_rollout_ref.actor.optim.lr"
METRIC = "val-core/tiny_arithmetic/reward/mean@1"


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(180)
class SweepSearchTest(PrivateStudioBrowserTestCase):
    def test_a_pruned_member_shows_its_reason_and_the_next_member_is_announced(self):
        from playwright.sync_api import expect

        sweep = sweep_create(
            experiment=make_experiment(self.owner),
            name="search",
            spec={
                "mode": "tpe",
                "count": 3,
                "seed": 0,
                "params": {LR: {"log_uniform": [1e-6, 1e-4]}},
                "objective": {"metric": METRIC, "direction": "maximize"},
                "pruner": {"type": "median", "n_startup_trials": 1},
            },
            concurrency=1,
        )
        first = sweep.members.get(index=1).run
        for step, score in ((1, 0.5), (2, 0.7)):
            metric_point_upsert(run_id=first.pk, step=step, metrics={METRIC: score})
        Run.objects.filter(pk=first.pk).update(status=RunStatus.SUCCEEDED)
        [second_id] = sweep_advance(sweep_id=sweep.pk)
        now = timezone.now()
        Run.objects.filter(pk=second_id).update(
            status=RunStatus.RUNNING, started_at=now, heartbeat_at=now
        )
        page = self.page
        page.goto(self.live_server_url + sweep.get_absolute_url())
        expect(page.locator("[data-sweep-field=strategy]")).to_contain_text(
            "Bayesian (Optuna TPE), 3 members, seed 0"
        )
        expect(page.locator("[data-sweep-field=best-text]")).to_have_text(f"#1, {METRIC} = 0.7")
        second = page.locator('tr[data-member="2"]')
        expect(second.locator("[data-cell=status]")).to_have_text("running")
        page.wait_for_function(
            "() => document.querySelectorAll('#compare-live .connection[data-state=live]').length"
        )

        # Its first validation falls below the finished member's: pruned at that step, live.
        in_driver_thread(second_id, lambda rec: rec.on_step(1, {METRIC: 0.1}))
        expect(second.locator("[data-cell=status]")).to_have_text("pruned", timeout=15000)
        expect(second.locator("[data-cell=pruned]")).to_have_text(
            f"best {METRIC} so far = 0.1 at step 1, below the median 0.5 of 1 finished member(s)"
        )
        expect(page.locator("[data-sweep-field=new-members]")).to_be_hidden()

        # Its driver stops; the dispatch task draws the next member into the freed slot.
        in_driver_thread(second_id, lambda rec: rec.on_finish(status="cancelled"))
        assert Run.objects.get(pk=second_id).status == RunStatus.CANCELLED
        assert len(sweep_advance(sweep_id=sweep.pk)) == 1
        expect(page.locator("[data-sweep-field=new-members]")).to_be_visible(timeout=15000)
        expect(page.locator("[data-sweep-field=count]")).to_have_text("3")
        expect(second.locator("[data-cell=status]")).to_have_text("pruned")
        page.screenshot(path=str(artifacts_dir() / "sweep_search_page.png"), full_page=True)
        assert self.errors == []
