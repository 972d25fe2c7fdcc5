"""Load: 50 browsers watch one live run through a real Daphne server; each gets every step in order.

The viewers are aiohttp WebSocket clients carrying a logged-in session cookie and the site's own
Origin, as a browser tab would; the steps are recorded from another thread by the driver's
``RunRecorder`` over the Redis channel layer, as a run's driver records them.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta

import aiohttp
import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from tests.e2e.browser import LiveLayerTestCase, in_driver_thread
from tests.webapp.live import running_run, step_metrics

VIEWERS = 50
STEPS = 120


def record_and_finish(recorder) -> None:
    """Record every step as fast as the recorder writes them (far faster than a run), then end."""
    for step in range(1, STEPS + 1):
        recorder.on_step(step, step_metrics(step))
    recorder.on_finish(status="succeeded")


async def watch(url: str, origin: str, session: str, steps: list[int], ready: asyncio.Event,
                connected: list[int]) -> None:  # fmt: skip
    """Follow one run's socket until its last step; append every step it is sent to ``steps``."""
    cookies = {"sessionid": session}
    async with (
        aiohttp.ClientSession(cookies=cookies) as client,
        client.ws_connect(url, origin=origin, max_msg_size=0) as socket,
    ):
        async for message in socket:
            data = message.json()
            if data["type"] == "backlog" and data["complete"]:
                connected.append(1)
                if len(connected) == VIEWERS:
                    ready.set()
            elif data["type"] == "metrics":
                steps.extend(point["step"] for point in data["points"])
                if steps and steps[-1] >= STEPS:
                    return


@pytest.mark.slow
@pytest.mark.timeout(240)
class LiveLoadTest(LiveLayerTestCase):
    def test_fifty_viewers_each_receive_every_step_in_order(self):
        owner = get_user_model().objects.create_user("alice", password="alice-pass")
        client = Client()
        client.force_login(owner)
        session = client.cookies["sessionid"].value
        run = running_run(owner, total_steps=STEPS, t0=timezone.now() - timedelta(seconds=5))
        url = self.live_server_url.replace("http", "ws", 1) + f"/ws/runs/{run.pk}/"
        received: list[list[int]] = [[] for _ in range(VIEWERS)]

        async def main() -> None:
            ready = asyncio.Event()
            connected: list[int] = []
            viewers = [
                asyncio.create_task(
                    watch(url, self.live_server_url, session, steps, ready, connected)
                )
                for steps in received
            ]
            await asyncio.wait_for(ready.wait(), 60)
            recorder = threading.Thread(
                target=in_driver_thread,
                args=(run.pk, record_and_finish),
            )
            recorder.start()
            await asyncio.wait_for(asyncio.gather(*viewers), 120)
            recorder.join(30)

        asyncio.run(main())
        for steps in received:
            assert steps == list(range(1, STEPS + 1))
