"""The run's state snapshot: the page's first paint and every socket message share one serialiser,
and each step and each driver heartbeat carries it (checkpoint, heartbeat, stall, step)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.db import connection
from django.test import Client
from django.utils import timezone

from tests.webapp.live import (  # noqa: F401  (fixtures)
    SOCKET_TEST_MARKS,
    private_redis_layer,
    running_run,
    short_lived_connections,
    step_metrics,
)
from tests.webapp.runs.test_consumers import driver_publisher, open_socket, receive
from webapp.runs.models import Run
from webapp.runs.state import run_state
from workers.database_recorder import RunRecorder
from workers.driver import HeartbeatThread

pytestmark = SOCKET_TEST_MARKS


async def test_a_step_carries_the_runs_snapshot_with_its_checkpoint(owner):
    stalled = timezone.now() - timedelta(minutes=5)
    run = await database_sync_to_async(running_run)(
        owner, total_steps=10, heartbeat_at=stalled, stalled_since=stalled
    )
    communicator = await open_socket(f"/ws/runs/{run.pk}/?since=0", owner)
    first = await receive(communicator, "status")
    assert first["run"]["latest_checkpoint"] == "" and first["run"]["stalled_since"] is not None
    await receive(communicator, "metrics")  # the (empty) catch-up

    def step() -> None:
        publisher = driver_publisher()
        try:
            recorder = RunRecorder(run.pk, publisher)
            recorder.on_checkpoint(1, "/ckpt/global_step_1")
            recorder.on_step(1, step_metrics(1))
        finally:
            publisher.close()
            connection.close()

    await asyncio.to_thread(step)
    message = await receive(communicator, "metrics")
    snapshot = message["run"]
    assert [p["step"] for p in message["points"]] == [1]
    assert snapshot["latest_checkpoint"] == "/ckpt/global_step_1"
    assert snapshot["latest_step"] == 1 and snapshot["stalled_since"] is None
    assert snapshot["heartbeat_at"] >= message["points"][0]["time"] > stalled.timestamp()
    # What the socket says is what a reload would show: the same serialiser over the row.
    fresh = await database_sync_to_async(Run.objects.get)(pk=run.pk)
    expected = run_state(fresh)
    assert {k: v for k, v in snapshot.items() if k != "heartbeat_at"} == {
        k: v for k, v in expected.items() if k != "heartbeat_at"
    }
    await communicator.disconnect()


async def test_each_driver_heartbeat_sends_the_fresh_snapshot(owner):
    old = timezone.now() - timedelta(minutes=5)
    run = await database_sync_to_async(running_run)(owner, total_steps=10, heartbeat_at=old)
    communicator = await open_socket(f"/ws/runs/{run.pk}/?since=0", owner)
    assert (await receive(communicator, "status"))["run"]["heartbeat_at"] == pytest.approx(
        old.timestamp(), abs=0.01
    )
    await receive(communicator, "metrics")
    before = time.time()
    heartbeat = HeartbeatThread(run.pk, 0.2, publish=True)
    heartbeat.start()
    try:
        status = await receive(communicator, "status")
    finally:
        heartbeat.stop()
        await asyncio.to_thread(heartbeat.join, 5)
    assert status["run"]["heartbeat_at"] >= before - 1
    assert status["run"]["status"] == "running" and status["progress"]["latest_step"] == 0
    await communicator.disconnect()


def test_the_first_paint_is_the_snapshot_the_socket_sends(owner):
    run = running_run(
        owner, total_steps=10, driver="pid:7", latest_checkpoint="/ckpt/global_step_3"
    )
    client = Client()
    client.force_login(owner)
    page = client.get(run.get_absolute_url()).content.decode()
    found = re.search(r'<script id="run-state" type="application/json">(.*?)</script>', page)
    assert found, "the run page embeds its state for run_summary.js"
    assert json.loads(found.group(1)) == run_state(run)
