"""An external run's page in Debian's Chromium, fed through the external-run API of the live
server (real HTTP, as ``posttrain watch`` sends): where it lives, no cancel, its unknown config
keys, live charts and sample count over the socket, and the inspector's token colouring from the
log-probs it sent. Hostile text it sent stays text (no dialog opens, no page error)."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.browser import LiveBrowserTestCase
from tests.e2e.browser import artifacts as artifacts_dir
from tests.e2e.test_live_charts import TRACE_POINTS
from webapp.api.tokens import token_create
from webapp.external.services import prompt_index_of

XSS = "<img src=x onerror=alert(1)>"
PROMPT = "What is 2+3?"


def sample(step: int, index: int) -> dict:
    return {
        "step": step, "prompt": PROMPT, "response": f"it is {4 + index} {XSS}",
        "reward": float(index == 1), "sample_index": index, "ground_truth": "5",
        "tokens": ["it", " is", f" {4 + index}"], "token_logprobs": [-0.05, -0.2, -2.5 + index],
        "reward_parts": {"acc": float(index == 1)},
    }  # fmt: skip


def metrics(step: int) -> dict:
    return {"critic/score/mean": step / 10, "actor/entropy": 1.0, f"actor/{XSS}": 0.5}


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(180)
class ExternalRunPageTest(LiveBrowserTestCase):
    def api(self) -> httpx.Client:
        _, token = token_create(owner=self.owner, name="watch")
        return httpx.Client(
            base_url=f"{self.live_server_url}/api",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )

    def test_an_external_runs_page_says_where_it_lives_and_follows_it_live(self):
        dialogs: list[str] = []
        self.page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        with self.api() as api:
            config = {
                "trainer": {"project_name": "gsm8k", "experiment_name": "qwen", "new_knob": 1},
                XSS: {"a": 1},
            }
            run = api.post(
                "/external-runs",
                json={"key": "e2e-external-run-key", "name": "qwen", "source": "verl",
                      "location": "gpu-07:/home/u/verl", "config": config, "total_steps": 10,
                      "client": "posttrain watch 0.2"},
            ).json()  # fmt: skip
            steps = [{"step": s, "metrics": metrics(s)} for s in (1, 2, 3)]
            assert api.post(f"/external-runs/{run['id']}/steps", json={"steps": steps}).is_success

            page = self.page
            page.goto(self.live_server_url + run["url"])
            page.wait_for_selector(".connection[data-state=live]")
            page.evaluate("window.__samePage = true")
            panel = page.inner_text("#external-run")
            assert "launched by verl, not by the studio" in panel
            assert "gpu-07:/home/u/verl" in panel and "posttrain watch 0.2" in panel
            assert "The studio cannot cancel it" in panel
            assert "2 config keys the studio's schema does not know" in panel
            page.click("[data-field=unknown-keys] summary")
            assert XSS in page.inner_text("[data-field=unknown-keys]")  # shown as text
            assert page.locator("[data-field=cancel]").is_hidden()
            assert page.locator("[data-field=resume]").is_hidden()
            assert page.locator("text=Clone into builder").count() == 0
            score = ["score", "critic/score/mean"]
            page.wait_for_function(f"(a) => ({TRACE_POINTS})(a) === 3", arg=score, timeout=20000)

            # The client goes on: steps and a step's samples in two batches, over the socket.
            more = [{"step": s, "metrics": metrics(s)} for s in (4, 5, 6)]
            assert api.post(f"/external-runs/{run['id']}/steps", json={"steps": more}).is_success
            page.wait_for_function(f"(a) => ({TRACE_POINTS})(a) === 6", arg=score, timeout=15000)
            for batch in ([sample(7, 0)], [sample(7, 1), sample(7, 2)]):
                body = {"samples": batch}
                assert api.post(f"/external-runs/{run['id']}/samples", json=body).is_success
            page.wait_for_function(
                "() => document.querySelector('[data-field=sample-count]').textContent === '3'",
                timeout=15000,
            )
            assert page.evaluate("window.__samePage") is True
            page.screenshot(path=str(artifacts_dir() / "external-run.png"), full_page=True)

            # The inspector: the group of the prompt, tokens coloured by the log-probs sent.
            index = prompt_index_of(PROMPT)
            page.goto(
                f"{self.live_server_url}/runs/{run['id']}/samples/group/?step=7&prompt={index}"
            )
            assert page.locator(".response-card").count() == 3
            page.click("#token-view-button")
            tokens = page.locator(".response-card").first.locator(".tok")
            assert tokens.count() == 3
            title = tokens.nth(2).get_attribute("title")
            assert title.startswith('token " 4" · log-prob -2.5'), title
            page.screenshot(path=str(artifacts_dir() / "external-run-tokens.png"), full_page=True)

            # Finished by its client: the page shows the end state without a reload.
            page.goto(self.live_server_url + run["url"])
            page.wait_for_selector(".connection[data-state=live]")
            assert api.post(
                f"/external-runs/{run['id']}/finish", json={"status": "succeeded"}
            ).is_success
            page.wait_for_function(
                "() => document.querySelector('#run-summary .status').textContent === 'succeeded'",
                timeout=15000,
            )
        assert dialogs == [] and self.errors == []
