"""The run socket carries the stored alerts with the backlog (and with a reconnect's status) and
forwards each new alert, through the real ASGI stack and Redis layer."""

from __future__ import annotations

import asyncio
import math

import pytest

from tests.webapp.live import (  # noqa: F401  (fixtures)
    SOCKET_TEST_MARKS,
    private_redis_layer,
    running_run,
    short_lived_connections,
)
from tests.webapp.runs.test_consumers import open_socket, publish_steps, receive
from webapp.runs.driver_writes import run_record_step

pytestmark = SOCKET_TEST_MARKS

NAN_LOSS = {
    "check": "non_finite_loss",
    "label": "NaN/inf loss",
    "step": 2,
    "message": "actor/pg_loss is nan",
}


@pytest.fixture
def run_with_alert(owner):
    run = running_run(owner, total_steps=10)
    run_record_step(run_id=run.pk, step=1, metrics={"actor/pg_loss": 0.01})
    run_record_step(run_id=run.pk, step=2, metrics={"actor/pg_loss": math.nan})
    return run


async def test_the_backlog_and_a_reconnect_carry_the_stored_alerts(run_with_alert, owner):
    communicator = await open_socket(f"/ws/runs/{run_with_alert.pk}/", owner)
    head = await receive(communicator, "backlog")
    assert not head["complete"] and "health" not in head
    rest = await receive(communicator, "backlog")
    assert rest["complete"] and rest["health"] == [NAN_LOSS]
    await communicator.disconnect()
    communicator = await open_socket(f"/ws/runs/{run_with_alert.pk}/?since=2", owner)
    status = await receive(communicator, "status")
    assert status["health"] == [NAN_LOSS]
    await communicator.disconnect()


async def test_an_alert_that_fires_is_forwarded_before_its_step(run_with_alert, owner):
    communicator = await open_socket(f"/ws/runs/{run_with_alert.pk}/?since=2", owner)
    await receive(communicator, "status")
    await receive(communicator, "metrics")  # the (empty) catch-up after step 2
    # publish_steps records live_metrics-like steps: actor/kl_loss = step / 1000 is over 1.
    await asyncio.to_thread(publish_steps, run_with_alert.pk, [1500])
    health = await receive(communicator, "health")
    assert health == {
        "type": "health",
        "alerts": [
            {
                "check": "kl_over_target",
                "label": "KL over target",
                "step": 1500,
                "message": "actor/kl_loss 1.5 is over the limit 1",
            }
        ],
    }
    metrics = await receive(communicator, "metrics")
    assert [p["step"] for p in metrics["points"]] == [1500]
    await communicator.disconnect()
