"""The run's own log in Debian's Chromium: the driver's output appears as it is written, no reload;
the page holds the newest lines only, finds lines in the whole log, downloads it, and shows a
line of HTML as text."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from tests.e2e.browser import LiveBrowserTestCase
from tests.e2e.browser import artifacts as artifacts_dir
from tests.webapp.live import running_run
from webapp.runs.driver_writes import run_finish
from webapp.runs.logs import run_log_path
from webapp.runs.models import RunStatus

LOG_TEXT = "() => document.querySelector('[data-log-field=text]').textContent"


def append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(120)
class RunLogTest(LiveBrowserTestCase):
    def test_the_log_follows_the_driver_and_is_searched_and_downloaded(self):
        folder = Path(tempfile.mkdtemp())
        run = running_run(self.owner, checkpoint_dir=str(folder / "checkpoints"))
        log = run_log_path(run)
        log.write_text(
            "loading tiny://model\n"
            "<script>window.__pwned = 1</script><img src=x onerror='window.__pwned = 2'>\n"
            "\x1b[33mwarming up\x1b[0m\n"
        )
        page = self.page
        page.goto(self.live_server_url + run.get_absolute_url())
        page.wait_for_function(f"({LOG_TEXT})().includes('warming up')")
        text = page.evaluate(LOG_TEXT)
        assert text.splitlines() == [
            "loading tiny://model",
            "<script>window.__pwned = 1</script><img src=x onerror='window.__pwned = 2'>",
            "warming up",
        ]
        assert (
            page.evaluate("document.querySelectorAll('#run-log script, #run-log img').length") == 0
        )
        page.evaluate("window.__samePage = true")

        append(log, "step 1: critic/score/mean=0.25\nstep 2: critic/score/mean=0.5\n")
        page.wait_for_function(f"({LOG_TEXT})().includes('step 2')")
        assert page.evaluate("window.__samePage") is True  # no reload

        page.fill("[data-log-field=search] input[name=q]", "SCORE/MEAN")
        page.click("[data-log-field=search] button")
        page.wait_for_selector("[data-log-field=matches] li")
        matches = page.eval_on_selector_all(
            "[data-log-field=matches] li", "(items) => items.map((li) => li.textContent)"
        )
        assert matches == ["4step 1: critic/score/mean=0.25", "5step 2: critic/score/mean=0.5"]

        with page.expect_download() as download:
            page.click("[data-log-field=download]")
        assert download.value.suggested_filename == f"run-{run.pk}-driver.log"
        assert Path(download.value.path()).read_text().startswith("loading tiny://model\n")

        # A flood: the page keeps the newest 2,000 lines and says the rest is in the download.
        append(log, "".join(f"generating batch {i}\n" for i in range(3000)))
        page.wait_for_function(f"({LOG_TEXT})().endsWith('generating batch 2999')")
        assert page.evaluate("window.postTrainLog.lines.length") == 2000
        assert "download the log" in page.inner_text("[data-log-field=note]")

        run_finish(run_id=run.pk, status=RunStatus.SUCCEEDED)
        page.reload()  # the log outlives the run
        page.wait_for_function(f"({LOG_TEXT})().endsWith('generating batch 2999')")
        page.screenshot(path=str(artifacts_dir() / "run-log.png"), full_page=True)
        assert page.evaluate("window.__pwned") is None
        assert self.errors == []
