"""A Redis restart under live run sockets and a recording driver, on a private ``redis-server``.

The shared Redis is never touched: the test starts its own server on a free port, points the
channel layer (the studio's own host options, another address) at it, kills it with SIGKILL
while a page follows a run and the driver records steps, and starts it again on the same port.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from channels.db import database_sync_to_async
from channels.layers import channel_layers
from django.db import connection

from tests.webapp.live import private_channel_layers, record_steps, running_run, step_metrics
from tests.webapp.outage import closed_port
from tests.webapp.runs.test_consumers import (  # noqa: F401
    open_socket,
    receive,
    short_lived_connections,
)
from webapp.runs.consumers import CLOSE_LAYER_UNAVAILABLE
from webapp.runs.models import MetricPoint
from workers.database_recorder import RunRecorder
from workers.publish import RunEventPublisher

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


class PrivateRedis:
    """A throwaway ``redis-server`` on ``port``: no persistence, so a restart forgets every key."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"redis-server did not listen on port {self.port} within 10 s")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def private_redis(settings):
    redis = PrivateRedis(closed_port())
    redis.start()
    layers = private_channel_layers(settings.CHANNEL_LAYERS)
    layers["default"]["CONFIG"]["hosts"][0]["address"] = f"redis://127.0.0.1:{redis.port}/0"
    settings.CHANNEL_LAYERS = layers
    yield redis
    redis.kill()


async def next_of(communicator, kind: str) -> dict:
    """Return the next message of type ``kind``, skipping others (status, samples)."""
    while True:
        message = await communicator.receive_json_from(timeout=10)
        if message["type"] == kind:
            return message


async def close_code(communicator) -> int:
    output = await communicator.receive_output(timeout=10)
    assert output["type"] == "websocket.close", output
    return output["code"]


async def test_sockets_and_the_driver_ride_out_a_redis_restart(owner, private_redis, tmp_path):
    run = await database_sync_to_async(running_run)(owner, total_steps=100)
    await database_sync_to_async(record_steps)(run, range(1, 11))
    driver = ThreadPoolExecutor(max_workers=1)  # the driver's thread: its recorder and publisher
    loop = asyncio.get_running_loop()
    publisher = RunEventPublisher(channel_layers.make_backend("default"))
    recorder = RunRecorder(run.pk, publisher, spill_dir=tmp_path)

    async def record(steps: range) -> None:
        def on_steps() -> None:
            for step in steps:
                recorder.on_step(step, step_metrics(step))

        await loop.run_in_executor(driver, on_steps)

    try:
        page = await open_socket(f"/ws/runs/{run.pk}/", owner)
        assert (await next_of(page, "backlog"))["last_step"] == 10
        while not (await receive(page, "backlog"))["complete"]:
            pass
        await record(range(11, 12))
        assert [p["step"] for p in (await next_of(page, "metrics"))["points"]] == [11]

        # Redis dies: the open page is told to reconnect. The layer's other pooled connection
        # (the one group_add used) is left stale: the next socket's first command meets it.
        private_redis.kill()
        assert await close_code(page) == CLOSE_LAYER_UNAVAILABLE
        # The driver records on: the steps land in PostgreSQL, their events are dropped.
        await record(range(12, 21))
        assert publisher.failures >= 1 and publisher.failures + publisher.dropped == 9
        stored = MetricPoint.objects.filter(run=run, step__gt=11).values_list("step", flat=True)
        assert sorted(await database_sync_to_async(list)(stored)) == list(range(12, 21))

        # Redis is back (empty): a page reconnecting with ?since= gets every missed step at once.
        private_redis.start()
        started = time.monotonic()
        again = await open_socket(f"/ws/runs/{run.pk}/?since=11", owner)
        assert (await receive(again, "status"))["run"]["status"] == "running"
        connected_s = time.monotonic() - started
        missed = await receive(again, "metrics")
        caught_up_s = time.monotonic() - started
        assert [p["step"] for p in missed["points"]] == list(range(12, 21))
        fresh = await open_socket(f"/ws/runs/{run.pk}/", owner)
        assert (await next_of(fresh, "backlog"))["last_step"] == 20
        while not (await receive(fresh, "backlog"))["complete"]:
            pass

        # The driver's publisher sends again once its back-off is over; both pages hear it.
        await asyncio.sleep(max(0.0, publisher.retry_at - time.monotonic()))
        await record(range(21, 22))
        for communicator in (again, fresh):
            assert [p["step"] for p in (await next_of(communicator, "metrics"))["points"]] == [21]
        print(
            f"after the restart: connected in {connected_s * 1000:.0f} ms, the 9 steps recorded "
            f"during the outage arrived in {caught_up_s * 1000:.0f} ms; publisher: "
            f"{publisher.failures} failed sends, {publisher.dropped} events dropped unsent"
        )

        # Down again: the open pages are told to reconnect, and so is one that connects meanwhile.
        private_redis.kill()
        during = await open_socket(f"/ws/runs/{run.pk}/?since=21", owner)
        for communicator in (again, fresh, during):
            assert await close_code(communicator) == CLOSE_LAYER_UNAVAILABLE
        for communicator in (page, again, fresh, during):
            await communicator.disconnect()
    finally:
        await loop.run_in_executor(driver, lambda: (publisher.close(), connection.close()))
        driver.shutdown()
