"""The run page in Debian's Chromium while Redis restarts: "reconnecting", then every step.

A live Daphne server (another process) talks to a private ``redis-server`` that the test kills
with SIGKILL and starts again on the same port; the steps the driver records meanwhile reach
PostgreSQL only, and the page reads them with ``?since=`` once it is back.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from tests.e2e.browser import CHROMIUM, LiveLayerTestCase, logged_in_page
from tests.e2e.test_live_charts import TRACE_POINTS, record_in_driver_thread
from tests.webapp.live import record_steps, running_run
from tests.webapp.outage import closed_port
from tests.webapp.runs.test_redis_restart import PrivateRedis

# Every state the connection badge takes, in order, from the moment this is evaluated.
WATCH_STATES = """() => {
  const badge = document.querySelector("#run-live .connection");
  window.__states = [];
  new MutationObserver(() => window.__states.push(badge.dataset.state))
    .observe(badge, {attributes: true, attributeFilter: ["data-state"]});
}"""
KL_STEPS = """() => {
  const p = window.postTrainCharts.panels.get("kl");
  return p.plot.data[p.traces.findIndex((t) => !t.smoothed)].x;
}"""


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(90)
class RedisRestartPageTest(LiveLayerTestCase):
    @classmethod
    def channel_layers(cls) -> dict:
        layers = super().channel_layers()
        layers["default"]["CONFIG"]["hosts"][0]["address"] = f"redis://127.0.0.1:{cls.redis.port}/0"
        return layers

    @classmethod
    def setUpClass(cls):
        if not Path(CHROMIUM).exists():
            pytest.skip(f"{CHROMIUM} is missing; apt-get install chromium")
        cls.redis = PrivateRedis(closed_port())
        cls.redis.start()
        super().setUpClass()

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        cls.redis.kill()

    def test_the_page_shows_reconnecting_then_gets_every_step_after_a_redis_restart(self):
        owner = get_user_model().objects.create_user("alice", password="alice-pass")
        client = Client()
        client.force_login(owner)
        t0 = timezone.now() - timedelta(seconds=60)
        run = running_run(owner, total_steps=40, t0=t0)
        record_steps(run, range(1, 6), t0=t0)
        errors: list[str] = []
        with logged_in_page(
            self.live_server_url, client.cookies["sessionid"].value, errors
        ) as page:
            page.goto(self.live_server_url + run.get_absolute_url())
            page.wait_for_selector(".connection[data-state=live]", timeout=20000)
            assert page.evaluate(TRACE_POINTS, ["score", "critic/score/mean"]) == 5
            page.evaluate(WATCH_STATES)

            self.redis.kill()
            page.wait_for_selector(".connection[data-state=reconnecting]", timeout=10000)
            record_in_driver_thread(run.pk, range(6, 11))  # PostgreSQL only: Redis is down
            time.sleep(1)  # a retry or two meets the dead Redis
            self.redis.start()
            restarted = time.monotonic()
            page.wait_for_function(
                f"(args) => ({TRACE_POINTS})(args) === 10",
                arg=["score", "critic/score/mean"],
                timeout=20000,
            )
            caught_up_s = time.monotonic() - restarted
            page.wait_for_selector(".connection[data-state=live]")
            states = page.evaluate("window.__states")
            assert page.evaluate(KL_STEPS) == list(range(1, 11))  # each step once, in order
            query = page.evaluate("window.postTrainStream.socket.url").split("?")[1].split("&")
            assert "since=5" in query  # beside the run log's offset (log=)
            # Only "reconnecting" until the server answers again: no flicker to live or offline.
            assert states[-1] == "live" and set(states[:-1]) == {"reconnecting"}, states

            record_in_driver_thread(run.pk, range(11, 12))  # live again, through Redis
            page.wait_for_function(
                f"(args) => ({TRACE_POINTS})(args) === 11",
                arg=["score", "critic/score/mean"],
                timeout=15000,
            )
            print(f"after the restart the page had every step in {caught_up_s:.1f} s: {states}")
        assert errors == []
