"""The run socket through the real ASGI stack (sessions, origin check) and the real Redis layer.

Live events come from the driver's own ``RunRecorder`` and ``RunEventPublisher``, in another
thread, as a training process would send them.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from channels.db import database_sync_to_async
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator
from django.db import connection
from django.test import Client

from engine.trainer.reporting import SampleRecord
from tests.webapp.live import (  # noqa: F401  (fixtures)
    SOCKET_TEST_MARKS,
    private_redis_layer,
    record_steps,
    running_run,
    short_lived_connections,
    step_metrics,
)
from webapp.asgi import application
from webapp.runs.metrics import HEADLINE_METRICS
from workers.database_recorder import RunRecorder
from workers.publish import RunEventPublisher

pytestmark = SOCKET_TEST_MARKS


@pytest.fixture(autouse=True)
def kl_check_off(settings):
    """Raise the health check's KL limit: the synthetic KL (step / 1000) is over 1 past step
    1000, and its alert would come between the messages these socket tests expect."""
    settings.POSTTRAIN_HEALTH_KL_MAX = 1e9


def session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


async def open_socket(path: str, user=None) -> WebsocketCommunicator:
    headers = [(b"origin", b"http://testserver"), (b"host", b"testserver")]
    if user is not None:
        cookie = await database_sync_to_async(session_cookie)(user)
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, _ = await communicator.connect(timeout=10)
    assert connected
    return communicator


async def receive(communicator: WebsocketCommunicator, kind: str) -> dict:
    """Return the next message of type ``kind``, failing on any other."""
    message = await communicator.receive_json_from(timeout=10)
    assert message["type"] == kind, message
    return message


def driver_publisher() -> RunEventPublisher:
    """Return a publisher on its own layer instance, as in a driver process."""
    return RunEventPublisher(channel_layers.make_backend("default"))


def publish_steps(run_id: int, steps: list[int]) -> None:
    publisher = driver_publisher()
    try:
        recorder = RunRecorder(run_id, publisher)
        for step in steps:
            recorder.on_step(step, step_metrics(step) | {"actor/lr": 1e-6})
    finally:
        publisher.close()
        connection.close()


def finish_run(run_id: int) -> None:
    publisher = driver_publisher()
    try:
        RunRecorder(run_id, publisher).on_finish(status="succeeded")
    finally:
        publisher.close()
        connection.close()


@pytest.fixture
def run_with_steps(owner):
    run = running_run(owner, total_steps=5000)
    record_steps(run, range(1, 4001))
    return run


async def test_an_anonymous_socket_is_closed_with_4401(run_with_steps):
    communicator = await open_socket(f"/ws/runs/{run_with_steps.pk}/")
    assert await communicator.receive_output(timeout=5) == {"type": "websocket.close", "code": 4401}
    await communicator.disconnect()


async def test_another_users_socket_is_closed_with_4403(run_with_steps, other_user):
    for path in (f"/ws/runs/{run_with_steps.pk}/", "/ws/runs/999999/"):
        communicator = await open_socket(path, other_user)
        closed = await communicator.receive_output(timeout=5)
        assert closed == {"type": "websocket.close", "code": 4403}
        await communicator.disconnect()


async def test_backlog_is_downsampled_score_first_then_live_steps_follow(run_with_steps, owner):
    run = run_with_steps
    communicator = await open_socket(f"/ws/runs/{run.pk}/", owner)
    head = await receive(communicator, "backlog")
    assert not head["complete"] and head["last_step"] == 4000
    assert set(head["series"]) == {n for n in HEADLINE_METRICS if n in step_metrics(1)}
    assert [p["key"] for p in head["panels"]] == ["score"]
    rest = await receive(communicator, "backlog")
    assert rest["complete"] and rest["last_step"] == 4000
    assert set(rest["series"]) == set(step_metrics(1)) - set(head["series"])
    assert {"kl", "entropy", "response_length", "timing"} <= {p["key"] for p in rest["panels"]}
    for series in [*head["series"].values(), *rest["series"].values()]:
        assert len(series["step"]) <= 1500
        assert series["step"][0] == 1 and series["step"][-1] == 4000
    assert rest["run"]["status"] == "running" and rest["run"]["total_steps"] == 5000
    assert rest["progress"]["text"].startswith("step 4000 / 5000")

    # The driver records steps 4000 (already in the backlog), 4001 and 4002.
    await asyncio.to_thread(publish_steps, run.pk, [4000, 4001, 4002])
    first = await receive(communicator, "metrics")
    assert [p["step"] for p in first["points"]] == [4001]
    assert first["points"][0]["metrics"]["actor/kl_loss"] == 4.001
    assert [(p["key"], p["names"]) for p in first["panels"]] == [("metric:actor/lr", ["actor/lr"])]
    assert first["progress"]["latest_step"] == 4001
    second = await receive(communicator, "metrics")
    assert [p["step"] for p in second["points"]] == [4002] and "panels" not in second
    await communicator.disconnect()


async def test_status_changes_and_sample_batches_are_announced(run_with_steps, owner):
    run = run_with_steps
    communicator = await open_socket(f"/ws/runs/{run.pk}/?since=4000", owner)
    status = await receive(communicator, "status")
    assert status["run"]["status"] == "running"
    assert (await receive(communicator, "metrics"))["points"] == []

    sample = SampleRecord(
        step=4001, split="train", prompt_index=0, sample_index=0, group_id="g0",
        data_source="tiny_arithmetic", prompt_text="1+1=", response_text="2", ground_truth="2",
        reward=1.0, reward_parts={}, advantage=0.5, response_length=1, tokens=["2"],
        token_logprobs=[-0.1], token_ref_logprobs=None, token_advantages=None,
    )  # fmt: skip

    def finish() -> None:
        publisher = driver_publisher()
        try:
            recorder = RunRecorder(run.pk, publisher)
            recorder.on_samples(
                4001, [sample, dataclasses.replace(sample, sample_index=1, reward=0.0)]
            )
            recorder.on_finish(status="succeeded")
        finally:
            publisher.close()
            connection.close()

    await asyncio.to_thread(finish)
    samples = await receive(communicator, "samples")
    assert samples == {
        "type": "samples",
        "step": 4001,
        "split": "train",
        "count": 2,
        "reward_mean": 0.5,
    }
    done = await receive(communicator, "status")
    assert done["run"]["status"] == "succeeded" and done["run"]["finished_at"] is not None
    assert done["progress"]["eta_s"] is None and done["progress"]["text"].endswith("succeeded")
    await communicator.disconnect()


async def test_a_reconnecting_client_gets_exactly_the_missing_steps(run_with_steps, owner):
    run = run_with_steps
    communicator = await open_socket(f"/ws/runs/{run.pk}/?since=3990", owner)
    await receive(communicator, "status")
    missed = await receive(communicator, "metrics")
    assert [p["step"] for p in missed["points"]] == list(range(3991, 4001))
    assert missed["points"][-1]["metrics"] == step_metrics(4000)
    assert "panels" not in missed  # it knows these names already

    await communicator.send_json_to({"since_step": 3997})
    again = await receive(communicator, "metrics")
    assert [p["step"] for p in again["points"]] == [3998, 3999, 4000]
    await communicator.send_json_to({"since_step": "last"})
    error = await receive(communicator, "error")
    assert error["message"] == "since_step='last' is not a step; send a whole number >= 0"
    await communicator.send_json_to({"hello": 1})
    assert "since_step" in (await receive(communicator, "error"))["message"]

    # Steps recorded while it was away come once, then live steps continue after them.
    await asyncio.to_thread(publish_steps, run.pk, [4001])
    live = await receive(communicator, "metrics")
    assert [p["step"] for p in live["points"]] == [4001]
    await communicator.disconnect()


async def test_an_idle_socket_outlives_the_redis_read_timeout(owner):
    # redis-py 8 times reads out after 5 s by default while the layer blocks for 5 s per receive.
    run = await database_sync_to_async(running_run)(owner)
    communicator = await open_socket(f"/ws/runs/{run.pk}/", owner)
    backlog = await receive(communicator, "backlog")
    assert backlog["complete"] and backlog["series"] == {} and backlog["last_step"] is None
    await asyncio.sleep(6.5)
    await asyncio.to_thread(publish_steps, run.pk, [1])
    assert [p["step"] for p in (await receive(communicator, "metrics"))["points"]] == [1]
    await communicator.disconnect()


async def test_steps_whose_events_went_missing_are_read_from_the_database(run_with_steps, owner):
    run = run_with_steps
    communicator = await open_socket(f"/ws/runs/{run.pk}/?since=4000", owner)
    await receive(communicator, "status")
    await receive(communicator, "metrics")  # nothing after 4000 yet
    # Steps 4001-4002 land in PostgreSQL but their events are lost (a full channel, a restart).
    await database_sync_to_async(record_steps)(run, range(4001, 4003))
    await asyncio.to_thread(publish_steps, run.pk, [4003])
    healed = await receive(communicator, "metrics")
    assert [p["step"] for p in healed["points"]] == [4001, 4002, 4003]
    # A lost tail is read when the run's status changes (here: it ends).
    await database_sync_to_async(record_steps)(run, range(4004, 4006))
    await asyncio.to_thread(finish_run, run.pk)
    tail = await receive(communicator, "metrics")
    assert [p["step"] for p in tail["points"]] == [4004, 4005]
    assert (await receive(communicator, "status"))["run"]["status"] == "succeeded"
    await communicator.disconnect()
