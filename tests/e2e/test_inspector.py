"""The sample inspector in a real browser (Debian's chromium driven by Playwright).

A tiny GRPO run is launched through the studio's own path (``run_create`` -> ``start_run`` ->
driver process -> engine -> recorder -> PostgreSQL), with Celery in eager mode so no broker
queue is involved. When it has finished, the browser opens it from the run page, reads the step
view, switches split, opens a group, switches to the token view and colours it three ways, and
compares the run with a second one whose responses differ. Screenshots go to
``$POSTTRAIN_TEST_ARTIFACTS`` (default ``test-artifacts/``).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.db import connections
from django.test import override_settings
from django.urls import reverse

from engine.trainer.reporting import SampleRecord
from tests.e2e.browser import (
    CHROMIUM,
    LiveLayerTestCase,
    artifacts,
    in_driver_thread,
    logged_in_page,
)
from tests.webapp.fixtures import make_experiment
from webapp.runs.driver_writes import samples_write
from webapp.runs.models import Run, RunStatus, Sample
from webapp.runs.services import run_create
from workers.celery_app import app

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ENDED = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.LOST)


def fmt(value: float) -> str:
    """Format like the inspector's ``num`` filter."""
    return f"{value:.4g}"


def record_samples_in_driver_thread(run_id: int, samples: list[SampleRecord]) -> None:
    """Record one step from another thread, as the run driver does: its samples, then its
    metrics, which is when the recorder writes the whole step and sends its events."""
    step = samples[0].step

    def record(recorder) -> None:
        recorder.on_samples(step, samples)
        recorder.on_step(step, {"critic/score/mean": 0.5})

    in_driver_thread(run_id, record)


def shown_value(title: str) -> float:
    """Return the number a token's hover text shows (``token "4" · log-prob -0.25 (p = ...)``)."""
    match = re.search(r"prob (-?[0-9.]+(?:e[-+]?[0-9]+)?)", title)
    assert match, title
    return float(match.group(1))


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")
class InspectorInTheBrowser(LiveLayerTestCase):
    serve_static = True

    def setUp(self) -> None:
        from engine.env import data_dir
        from engine.tiny import ensure_tiny_assets

        self.data = Path(tempfile.mkdtemp(prefix="posttrain-inspector-"))
        self.addCleanup(shutil.rmtree, self.data, ignore_errors=True)
        shared = data_dir()
        ensure_tiny_assets(shared)
        (self.data / "tiny").symlink_to(shared / "tiny", target_is_directory=True)
        self.user = get_user_model().objects.create_user("alice", password="alice-pass")

    def finished_tiny_run(self) -> Run:
        experiment = make_experiment(
            self.user,
            name="tiny grpo",
            trainer__total_training_steps=2,
            trainer__test_freq=2,
            trainer__save_freq="-1",
        )
        eager = app.conf.task_always_eager
        app.conf.task_always_eager = True
        try:
            with override_settings(POSTTRAIN_DATA_DIR=self.data):
                run = run_create(experiment=experiment)
        finally:
            app.conf.task_always_eager = eager
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            run.refresh_from_db()
            if run.status in ENDED:
                break
            time.sleep(0.5)
        log = self.data / "runs" / str(run.pk) / "driver.log"
        tail = log.read_text()[-3000:] if log.exists() else "(no driver log)"
        assert run.status == RunStatus.SUCCEEDED, f"{run.status}: {run.error}\n{tail}"
        return run

    def second_run_with_other_answers(self, run: Run) -> Run:
        """Copy ``run``'s last train step into another run, appending " !" to every response."""
        other = Run.objects.create(
            experiment=run.experiment,
            owner=self.user,
            number=run.number + 1,
            status=RunStatus.SUCCEEDED,
            config=run.config,
        )
        step = Sample.objects.filter(run=run, split="train").order_by("-step")[0].step
        fields = [f.name for f in SampleRecord.__dataclass_fields__.values()]
        records = [
            SampleRecord(
                **{
                    **{name: getattr(s, name) for name in fields},
                    "response_text": s.response_text + " !",
                    "reward": 0.0,
                }
            )
            for s in Sample.objects.filter(run=run, split="train", step=step)
        ]
        samples_write(run_id=other.pk, samples=records)
        return other

    def test_a_finished_run_read_in_step_group_and_token_views(self) -> None:
        from playwright.sync_api import expect

        run = self.finished_tiny_run()
        other = self.second_run_with_other_answers(run)
        train = Sample.objects.filter(run=run, split="train")
        last_step = train.order_by("-step")[0].step
        step_rows = train.filter(step=last_step).count()
        val_steps = sorted(
            set(Sample.objects.filter(run=run, split="val").values_list("step", flat=True))
        )
        group = list(
            train.filter(
                step=last_step,
                prompt_index=train.filter(step=last_step).order_by("prompt_index")[0].prompt_index,
            ).order_by("sample_index")
        )
        rewards = [s.reward for s in group if math.isfinite(s.reward)]
        mean = sum(rewards) / len(rewards)
        first = group[0]

        self.client.force_login(self.user)
        session = self.client.cookies["sessionid"].value
        shots = artifacts()
        errors: list[str] = []
        with logged_in_page(
            self.live_server_url, session, errors, viewport={"width": 1400, "height": 1000}
        ) as page:
            # The run page links to the inspector, which opens at the latest train step.
            page.goto(f"{self.live_server_url}{run.get_absolute_url()}")
            page.click("a.inspect-samples")
            expect(page.locator("#samples-table tbody tr")).to_have_count(min(step_rows, 50))
            expect(page.locator(".step-summary")).to_contain_text(
                f"step {last_step} · {step_rows} train samples"
            )
            expect(page.locator("#step-input")).to_have_value(str(last_step))
            page.screenshot(path=str(shots / "inspector-step.png"), full_page=True)

            # Validation samples live apart, on their own steps.
            page.click(".split-tabs a[data-split=val]")
            expect(page.locator(".step-summary")).to_contain_text(f"step {val_steps[-1]} ·")
            expect(page.locator("#samples-table td.idx").first).to_have_text("0/0")
            page.click(".split-tabs a[data-split=train]")

            # Sorted by reward, highest first, on the server.
            page.select_option("select[name=sort]", "-reward")
            with page.expect_navigation():
                page.click("#step-form button[type=submit]")
            shown = [float(t) for t in page.locator("#samples-table td.reward").all_inner_texts()]
            assert shown == sorted(shown, reverse=True)

            # Group view: the prompt's responses side by side with the group's statistics.
            page.goto(f"{self.live_server_url}/runs/{run.pk}/samples/?split=train&step={last_step}")
            page.locator("#samples-table a.group-link").first.click()
            expect(page.locator(".response-card")).to_have_count(len(group))
            expect(page.locator(".group-mean")).to_have_text(fmt(mean))
            expect(page.locator(".response-card .response-text").first).to_have_text(
                first.response_text
            )
            expect(page.locator(".response-card .tokens").first).to_be_hidden()

            # Token view: one coloured span per token, the value on hover.
            page.click("#token-view-button")
            tokens = page.locator(".response-card").first.locator(".tok")
            expect(tokens).to_have_count(len(first.tokens))
            expect(page.locator(".response-card .response-text").first).to_be_hidden()
            title = tokens.first.get_attribute("title")
            assert title.startswith(f"token {json.dumps(first.tokens[0])} · log-prob "), title
            assert shown_value(title) == pytest.approx(first.token_logprobs[0], rel=1e-3)
            background = tokens.first.evaluate("n => getComputedStyle(n).backgroundColor")
            assert background.startswith("rgba(214, 60, 46"), background
            tokens.nth(1).hover()
            expect(page.locator("#token-readout")).to_have_text(
                tokens.nth(1).get_attribute("title")
            )
            page.select_option("#colour-by", "advantage")
            assert "advantage" in tokens.first.get_attribute("title")
            page.select_option("#colour-by", "kl")
            kl = first.token_logprobs[0] - first.token_ref_logprobs[0]
            title = tokens.first.get_attribute("title")
            assert "log-prob − ref log-prob" in title, title
            assert shown_value(title) == pytest.approx(kl, rel=1e-3, abs=1e-6)
            page.screenshot(path=str(shots / "inspector-tokens.png"), full_page=True)

            # Across runs: the second run's answers differ by " !", highlighted as insertions.
            page.goto(
                f"{self.live_server_url}/runs/{run.pk}/samples/compare/?split=train"
                f"&prompt={first.prompt_index}&runs={other.pk}"
            )
            expect(page.locator(".compare-summary tbody tr")).to_have_count(2)
            delta = page.locator(".compare-summary td.delta").nth(1)
            expect(delta).to_have_text(f"{0.0 - mean:+.4g}")
            inserted = page.locator(f"section[data-run-id='{other.pk}'] ins.diff-ins")
            expect(inserted).to_have_count(len(group))
            expect(inserted.first).to_have_text(" !")
            page.click("button[data-diff=char]")
            expect(inserted.first).to_have_text(" !")
            page.screenshot(path=str(shots / "inspector-compare.png"), full_page=True)

            # Across steps: the prompt's reward trend is drawn.
            page.goto(f"{self.live_server_url}/runs/{run.pk}/samples/prompt/?split=val&prompt=0")
            expect(page.locator("#trend-chart circle")).to_have_count(len(val_steps))
        assert errors == []

    def test_a_live_run_offers_each_new_step_and_can_follow_it(self) -> None:
        from playwright.sync_api import expect

        from tests.webapp.samples.conftest import records

        experiment = make_experiment(self.user, name="live grpo")
        run = Run.objects.create(
            experiment=experiment, owner=self.user, number=1, status=RunStatus.RUNNING, config={}
        )
        samples_write(run_id=run.pk, samples=records(1, 0, [1.0, 0.0]))
        self.client.force_login(self.user)
        session = self.client.cookies["sessionid"].value
        errors: list[str] = []
        with logged_in_page(self.live_server_url, session, errors) as page:
            steps_url = reverse("samples:steps", args=[run.pk])
            reads: list[str] = []
            page.on("request", lambda r: reads.append(r.url) if steps_url in r.url else None)
            page.goto(f"{self.live_server_url}/runs/{run.pk}/samples/")
            expect(page.locator("#step-input")).to_have_value("1")
            # The page follows the run's socket, from the run's latest step (no metric backlog),
            # and reads the step list once the socket has joined the run's group.
            following = page.locator("#inspector-step[data-socket=following]")
            expect(following).to_have_count(1)
            assert page.evaluate("window.postTrainStream.socket.url").endswith("?since=0")
            page.wait_for_function(
                f"performance.getEntriesByType('resource').some((e) => e.name.includes('{steps_url}'))"
            )
            assert len(reads) == 1, reads

            # The driver records step 2 and says so on the socket: the page offers it at once.
            record_samples_in_driver_thread(run.pk, records(2, 0, [0.0, 0.0]))
            news = page.locator("#step-news a")
            expect(news).to_have_text("step 2 recorded: show it", timeout=4000)
            expect(page.locator("#step-slider")).to_have_attribute("max", "1")
            assert len(reads) == 2, reads  # one read per event, no polling
            news.click()
            expect(page.locator("#step-input")).to_have_value("2")
            expect(following).to_have_count(1)

            # Following the latest step moves the page along by itself.
            page.check("#follow-latest")
            record_samples_in_driver_thread(run.pk, records(3, 0, [1.0, 1.0]))
            expect(page.locator("#step-input")).to_have_value("3", timeout=4000)
            expect(page.locator(".step-summary")).to_contain_text("step 3 · 2 train samples")
            expect(page.locator("#follow-latest")).to_be_checked()
            # ORM calls under Playwright's loop opened a connection of their own: close it here.
            connections.close_all()
        assert errors == []

    def test_tokens_read_as_decoded_and_the_whole_run_and_recurring_prompts_pages(self) -> None:
        from playwright.sync_api import expect

        from tests.webapp.samples.conftest import records

        experiment = make_experiment(self.user, name="bytes grpo")
        run = Run.objects.create(
            experiment=experiment, owner=self.user, number=1, status=RunStatus.SUCCEEDED, config={}
        )
        rows = []
        for step in (1, 2000):  # a late step: its label sits at the chart's right edge
            rows += records(step, 0, [0.0], responses=["9\ufffd7"], tokens=["9", "Þ", "7"])
            rows += records(step, 1, [1.0], responses=["9×7"], tokens=["9", "Ã", "Ĺ", "7"])
        for row in rows:
            n = len(row.tokens)
            row.token_logprobs, row.token_ref_logprobs = [-0.5] * n, None
            row.token_advantages = [0.25] * n
        samples_write(run_id=run.pk, samples=rows)
        self.client.force_login(self.user)
        session = self.client.cookies["sessionid"].value
        errors: list[str] = []
        base = f"{self.live_server_url}/runs/{run.pk}/samples"
        spans = "(nodes) => nodes.map((n) => n.textContent)"
        with logged_in_page(self.live_server_url, session, errors) as page:
            page.goto(f"{base}/group/?step=1&prompt=1")
            page.click("#token-view-button")
            tokens = page.eval_on_selector_all(".response-card .tokens .tok", spans)
            assert tokens == ["9", "\u00b7", "×", "7"]  # not 9, Ã, Ĺ, 7
            title = page.get_attribute(".response-card .tokens .tok:nth-child(2)", "title")
            assert title.startswith('token "Ã" (bytes C3, the start of a character')
            page.goto(f"{base}/group/?step=1&prompt=0#tokens")
            tokens = page.eval_on_selector_all(".response-card .tokens .tok", spans)
            assert tokens == ["9", "\\xDE", "7"]  # not 9, Þ, 7
            assert page.inner_text(".response-card .bad-byte") == "DE"

            page.goto(f"{base}/prompt/?prompt=0")
            right = page.evaluate(
                "() => { const labels = [...document.querySelectorAll('#trend-chart text.step-label')];"
                " const box = labels.at(-1).getBBox(); return [box.x + box.width, labels.at(-1).textContent]; }"
            )
            assert right[1] == "step 2000" and right[0] <= 640  # inside the chart's 640 wide box

            page.goto(f"{base}/run/")
            expect(page.locator("#run-samples-table tbody tr")).to_have_count(4)
            first = page.locator("#run-samples-table tbody tr").first
            assert first.get_attribute("data-step") == "1"  # the worst reward of the run first
            page.click("text=best reward")
            expect(
                page.locator("#run-samples-table tbody tr").first.locator(".reward")
            ).to_have_text("1")
            page.click("nav.inspector-tabs >> text=Recurring prompts")
            expect(page.locator("#recurring-table tbody tr")).to_have_count(2)
            page.screenshot(path=str(artifacts() / "inspector-recurring.png"), full_page=True)
            connections.close_all()
        assert errors == []
