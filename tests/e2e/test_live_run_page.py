"""The run page in Debian's Chromium: everything beside the charts follows the run, no reload.

One page load watches a queued run start, run three steps (samples, a checkpoint) and succeed;
the driver's side goes through ``webapp.runs.driver_writes`` and the driver's ``RunRecorder`` from
another thread, over the Redis layer, as in ``test_live_charts``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from engine.trainer.reporting import SampleRecord
from tests.e2e.browser import LiveBrowserTestCase, in_driver_thread
from tests.e2e.browser import artifacts as artifacts_dir
from tests.webapp.live import running_run, step_metrics
from webapp.runs.driver_writes import (
    run_claim_for_start,
    run_mark_running,
    run_set_driver,
    runs_mark_stalled,
)
from webapp.runs.metrics import epoch_seconds
from webapp.runs.models import RunStatus

# Every data-field of the page as text, and which buttons show.
FIELDS = """() => {
  const out = {};
  for (const node of document.querySelectorAll("[data-field]")) {
    out[node.dataset.field] = node.hidden ? null : node.textContent.trim();
  }
  out.status = document.querySelector("#run-summary .status").textContent;
  return out;
}"""


def sample(step: int, index: int) -> SampleRecord:
    return SampleRecord(
        step=step, split="train", prompt_index=0, sample_index=index, group_id="g0",
        data_source="tiny_arithmetic", prompt_text="1+1=", response_text="2", ground_truth="2",
        reward=1.0, response_length=1, tokens=["2"], token_logprobs=[-0.1],
    )  # fmt: skip


def as_sent(moment: datetime) -> str:
    """Return a time as the page shows what the socket sent (Unix seconds to the millisecond)."""
    return datetime.fromtimestamp(epoch_seconds(moment), UTC).strftime("%Y-%m-%d %H:%M:%S")


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(120)
class LiveRunPageTest(LiveBrowserTestCase):
    def wait_for(self, field: str, predicate: str) -> dict:
        """Wait until ``predicate`` (JS over ``value``) holds for a field; return every field."""
        self.page.wait_for_function(
            f"() => {{ const value = ({FIELDS})()[{field!r}]; return {predicate}; }}",
            timeout=10000,
        )
        return self.page.evaluate(FIELDS)

    def test_the_header_metrics_and_buttons_follow_a_run_from_queued_to_succeeded(self):
        run = running_run(
            self.owner,
            total_steps=None,
            status=RunStatus.QUEUED,
            started_at=None,
            heartbeat_at=None,
        )
        checkpoint = "/tmp/checkpoints/global_step_2"
        page = self.page
        page.goto(self.live_server_url + run.get_absolute_url())
        page.wait_for_selector(".connection[data-state=live]")
        page.evaluate("window.__samePage = true")
        first = page.evaluate(FIELDS)
        assert first["status"] == "queued" and first["started"] == "—"
        assert first["heartbeat"] == "—" and first["no-metrics"] == "No metrics recorded yet."
        assert first["cancel"] == "Cancel" and first["resume"] is None and first["delete"] is None
        assert first["sample-count"] == "0" and first["driver"] == "—"

        def start(recorder) -> None:
            assert run_claim_for_start(run_id=run.pk) is not None
            run_set_driver(run_id=run.pk, driver="pid:4242")
            assert run_mark_running(run_id=run.pk) is not None
            recorder.on_start(config={}, total_steps=3, start_step=0)

        in_driver_thread(run.pk, start)
        fields = self.wait_for("step", "value === '0 / 3'")
        assert fields["status"] == "running" and fields["started"] != "—"
        assert fields["driver"] == "pid:4242"
        assert re.fullmatch(r"\d+ seconds? ago", fields["heartbeat"]), fields["heartbeat"]
        assert fields["stalled"] is None

        # The stall sweep flags it (no step for more than 0 s); the next step clears the note.
        in_driver_thread(run.pk, lambda recorder: runs_mark_stalled(stall_after=0.0))
        fields = self.wait_for("stalled", "value !== null")
        assert re.fullmatch(r"stalled: no new step for \d+ seconds?", fields["stalled"])

        def steps(recorder) -> None:
            for step in (1, 2):
                recorder.on_samples(step, [sample(step, 0), sample(step, 1)])
                if step == 2:
                    recorder.on_checkpoint(step, checkpoint)
                recorder.on_step(step, step_metrics(step))

        in_driver_thread(run.pk, steps)
        fields = self.wait_for("step", "value === '2 / 3'")
        assert fields["stalled"] is None
        fields = self.wait_for("sample-count", "value === '4'")
        assert fields["metrics-step"] == "(step 2)"
        rows = page.eval_on_selector_all(
            "[data-field=metrics] tr",
            "(rows) => rows.map((r) => [r.querySelector('th').textContent, r.querySelector('td').textContent])",
        )
        # Summary names first (selectors.SUMMARY_METRICS), then the rest by name.
        assert [name for name, _ in rows] == [
            "critic/score/mean",
            "actor/kl_loss",
            "actor/entropy",
            "response_length/mean",
            "critic/score/max",
            "critic/score/min",
            "timing_s/gen",
        ]
        assert dict(rows)["actor/kl_loss"] == "0.002" and dict(rows)["critic/score/max"] == "1"
        assert fields["no-metrics"] is None and fields["cancel"] == "Cancel"

        def finish(recorder) -> None:
            recorder.on_step(3, step_metrics(3))
            recorder.on_finish(status="succeeded")

        in_driver_thread(run.pk, finish)
        fields = self.wait_for("cancel", "value === null")
        assert fields["status"] == "succeeded" and fields["finished"] != "—"
        assert fields["step"] == "3 / 3" and fields["metrics-step"] == "(step 3)"
        assert fields["checkpoint"] == checkpoint
        assert fields["delete"] == "Delete" and fields["resume"] is None  # succeeded: no resume
        kl = page.eval_on_selector(
            "[data-field=metrics] tr:nth-child(2) td", "(node) => node.textContent"
        )
        assert kl == "0.003"
        assert page.evaluate("window.__samePage") is True  # no reload
        run.refresh_from_db()
        assert fields["started"] == as_sent(run.started_at)
        assert fields["finished"] == as_sent(run.finished_at)
        page.screenshot(path=str(artifacts_dir() / "live-run-page.png"), full_page=True)
        assert self.errors == []

    def test_the_launch_note_goes_once_the_run_starts_and_the_header_names_its_id(self):
        from tests.webapp.fixtures import make_experiment
        from webapp.runs.models import Run

        running_run(self.owner, experiment=make_experiment(self.owner, name="earlier"))
        experiment = make_experiment(self.owner, name="mine")
        page = self.page
        page.goto(self.live_server_url + experiment.get_absolute_url())
        page.get_by_role("button", name="Launch a run").click()
        page.wait_for_selector(".connection[data-state=live]")
        run = Run.objects.get(experiment=experiment)
        assert run.number == 1 and run.pk > 1
        assert page.inner_text("h1").endswith(f"run #{run.pk}")
        assert page.inner_text(".message.launched") == f"Run #{run.pk} queued."

        def start(recorder) -> None:
            assert run_claim_for_start(run_id=run.pk) is not None
            assert run_mark_running(run_id=run.pk) is not None
            recorder.on_start(config={}, total_steps=3, start_step=0)

        in_driver_thread(run.pk, start)
        page.wait_for_selector(".message.launched", state="detached", timeout=10000)
        assert page.evaluate(FIELDS)["status"] == "running"
        assert self.errors == []
