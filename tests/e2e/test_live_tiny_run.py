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

# Keep each distinct state of the page's fields (FIELDS) in window.__states as it changes.
RECORD_STATES = f"""() => {{
  const fields = {FIELDS};
  window.__states = [];
  const record = () => {{
    const state = fields();
    const last = window.__states[window.__states.length - 1];
    if (!last || JSON.stringify(last) !== JSON.stringify(state)) window.__states.push(state);
  }};
  record();
  new MutationObserver(record).observe(document.body, {{
    subtree: true, childList: true, characterData: true, attributes: true,
  }});
}}"""


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

    def check_states(self, states: list[dict], run: Run) -> None:
        """Check the states the page went through: each field changed, each step was shown."""

        def seen(field: str) -> list:
            return list(dict.fromkeys(state[field] for state in states))

        statuses = seen("status")
        assert statuses[0] == "queued" and "running" in statuses, statuses
        assert statuses[-1] == "succeeded", statuses
        assert [step for step in seen("metrics-step") if step] == [
            "(step 1)", "(step 2)", "(step 3)"
        ], seen("metrics-step")  # fmt: skip
        assert {"1 / 3", "2 / 3", "3 / 3"} <= set(seen("step")), seen("step")
        assert seen("sample-count") == ["0", "32", "64", "96"], seen("sample-count")
        assert seen("driver") == ["—", run.driver], seen("driver")
        assert seen("started")[0] == "—" and len(seen("started")) == 2, seen("started")
        assert seen("finished")[0] == "—" and len(seen("finished")) == 2, seen("finished")
        heartbeats = seen("heartbeat")
        assert heartbeats[0] == "—" and all(
            re.fullmatch(r"\d+ seconds? ago", beat) for beat in heartbeats[1:]
        ), heartbeats
        checkpoints = seen("checkpoint")
        assert checkpoints[0] == "none yet" and checkpoints[-1] == run.latest_checkpoint
        assert any(c.endswith("global_step_2") for c in checkpoints), checkpoints
        # While step 2 was the newest, its checkpoint showed and the run could still be cancelled.
        mid = next(state for state in states if state["metrics-step"] == "(step 2)")
        assert mid["checkpoint"].endswith("global_step_2"), mid
        assert mid["status"] == "running" and mid["cancel"] == "Cancel" and mid["finished"] == "—"
        assert seen("resume") == [None]  # never resumable: the run succeeded
        assert seen("cancel")[0] == "Cancel" and seen("cancel")[-1] is None

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

        # The tiny steps take a fraction of a second: the page keeps every state it showed
        # (each socket message is its own task, so the observer sees each), checked at the end.
        page.evaluate(RECORD_STATES)
        self.start_worker()
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
        self.check_states(page.evaluate("window.__states"), run)
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
