"""A real tiny GRPO run, watched in Debian's Chromium on one page load from queued to succeeded.

The launch goes the whole way: ``run_create`` queues ``start_run`` for a Celery worker (a
subprocess on a queue of its own), which spawns the driver process, which trains the tiny model
and records each step; the driver's events reach the page over the studio's Redis under this
class's private prefix (``POSTTRAIN_CHANNEL_PREFIX``, which the worker and the driver inherit).
Every field beside the charts must change on its own: status, step, started and finished times,
heartbeat, checkpoint, sample count, driver, the latest-metrics table and the buttons.
"""

from __future__ import annotations

import os
import re

import pytest
from django.db import connections

from tests.e2e.browser import LiveBrowserTestCase
from tests.e2e.browser import artifacts as artifacts_dir
from tests.e2e.test_live_run_page import FIELDS
from tests.webapp.fixtures import (
    make_experiment,
    studio_dirs,  # noqa: F401
)
from tests.workers.test_lifecycle import SMALL, start_worker, tiny_cache  # noqa: F401
from webapp.runs.models import Run, RunStatus
from webapp.runs.services import run_create


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(420)
class LiveTinyRunPageTest(LiveBrowserTestCase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        from django.conf import settings

        cls._prefix = os.environ.get("POSTTRAIN_CHANNEL_PREFIX")
        os.environ["POSTTRAIN_CHANNEL_PREFIX"] = settings.CHANNEL_LAYERS["default"]["CONFIG"][
            "prefix"
        ]

    @classmethod
    def tearDownClass(cls) -> None:
        if cls._prefix is None:
            os.environ.pop("POSTTRAIN_CHANNEL_PREFIX", None)
        else:
            os.environ["POSTTRAIN_CHANNEL_PREFIX"] = cls._prefix
        super().tearDownClass()

    @pytest.fixture(autouse=True)
    def _worker(self, start_worker):  # noqa: F811
        self.start_worker = start_worker

    def fields(self) -> dict:
        return self.page.evaluate(FIELDS)

    def wait_for(self, field: str, predicate: str, timeout_s: float = 60) -> dict:
        """Wait until ``predicate`` (JS over ``value``) holds for a field; return every field."""
        try:
            self.page.wait_for_function(
                f"() => {{ const value = ({FIELDS})()[{field!r}]; return {predicate}; }}",
                timeout=timeout_s * 1000,
            )
        except Exception:
            run = Run.objects.get()
            log = run_log(run)
            pytest.fail(
                f"{field}: {predicate} never held; page {self.fields()}\n{run.status}\n{log}"
            )
        return self.fields()

    def test_one_page_load_follows_a_real_run_from_queued_to_succeeded(self):
        experiment = make_experiment(
            self.owner,
            **{**SMALL, "trainer__save_freq": 2},
            trainer__total_training_steps=3,
            trainer__test_freq=-1,
            trainer__val_before_train=False,
        )
        run = run_create(experiment=experiment)  # queued: no worker listens yet
        page = self.page
        page.goto(self.live_server_url + run.get_absolute_url())
        page.wait_for_selector(".connection[data-state=live]")
        page.evaluate("window.__samePage = true")
        first = self.fields()
        assert first["status"] == "queued" and first["step"] == "0"
        assert first["started"] == "—" and first["finished"] == "—"
        assert first["heartbeat"] == "—" and first["driver"] == "—"
        assert first["sample-count"] == "0" and first["checkpoint"] == "none yet"
        assert first["no-metrics"] == "No metrics recorded yet." and first["metrics"] is None
        assert first["cancel"] == "Cancel" and first["resume"] is None and first["delete"] is None

        self.start_worker()
        running = self.wait_for("status", "value === 'running'", timeout_s=120)
        assert re.fullmatch(r"pid:\d+", running["driver"]), running["driver"]
        assert running["started"] != "—" and running["cancel"] == "Cancel"
        assert re.fullmatch(r"\d+ seconds? ago", running["heartbeat"]), running["heartbeat"]

        mid = self.wait_for("metrics-step", "value === '(step 2)'", timeout_s=180)
        assert mid["checkpoint"].endswith("global_step_2"), mid["checkpoint"]
        assert int(mid["sample-count"]) >= 2 * 8 * 4  # two steps of 8 prompts x 4 samples
        assert mid["no-metrics"] is None and "critic/score/mean" in mid["metrics"]
        assert mid["finished"] == "—" and mid["cancel"] == "Cancel"

        end = self.wait_for("status", "value === 'succeeded'", timeout_s=180)
        end = self.wait_for("cancel", "value === null")
        run.refresh_from_db()
        assert run.status == RunStatus.SUCCEEDED
        assert end["step"] == "3 / 3" and end["finished"] != "—"
        assert end["metrics-step"] == "(step 3)"
        assert end["sample-count"] == str(run.samples.count()) == str(3 * 8 * 4)
        assert end["checkpoint"] == run.latest_checkpoint
        assert end["resume"] is None and end["delete"] == "Delete"  # succeeded: nothing to resume
        assert end["driver"] == run.driver and end["stalled"] is None
        rows = page.eval_on_selector_all(
            "[data-field=metrics] tr",
            "(rows) => rows.map((r) => r.querySelector('th').textContent)",
        )
        assert rows[0] == "critic/score/mean" and len(rows) > 10
        assert page.evaluate("window.__samePage") is True  # no reload
        # What the page shows live is what a reload shows: the same snapshot.
        page.screenshot(path=str(artifacts_dir() / "live-tiny-run-page.png"), full_page=True)
        page.reload()
        page.wait_for_selector(".connection[data-state=live]")
        reloaded = self.fields()
        for field in (
            "status",
            "step",
            "started",
            "finished",
            "checkpoint",
            "sample-count",
            "driver",
            "metrics-step",
            "cancel",
            "resume",
            "delete",
        ):
            assert reloaded[field] == end[field], (field, reloaded[field], end[field])
        assert self.errors == []
        # ORM calls under Playwright's loop opened a connection of their own: close it here.
        connections.close_all()


def run_log(run: Run) -> str:
    from pathlib import Path

    from django.conf import settings

    log = Path(settings.POSTTRAIN_DATA_DIR) / "runs" / str(run.pk) / "driver.log"
    return log.read_text()[-3000:] if log.exists() else "(no driver log)"
