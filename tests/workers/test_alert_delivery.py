"""Alert delivery on a real Celery worker: the run's end commits, the message goes over the
Redis broker to a worker, which posts it to a receiver on loopback; a failed attempt is retried
by the worker after the recorded wait."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from tests.webapp.alerts.test_alerts import Receiver, running_run
from tests.workers.celery_worker import start_celery_worker
from webapp.alerts.models import AlertDelivery
from webapp.alerts.services import alert_settings_update, subscription_create
from webapp.runs.driver_writes import run_finish
from workers.celery_app import app

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def worker(studio_dirs: Path, settings):
    """Start a solo Celery worker on a queue of its own, loopback webhooks allowed."""
    settings.POSTTRAIN_ALERTS_ALLOW_PRIVATE_WEBHOOKS = True
    queue = f"posttrain-test-{uuid.uuid4().hex[:12]}"
    previous = app.conf.task_default_queue
    app.conf.task_default_queue = queue
    env = {"POSTTRAIN_ALERTS_ALLOW_PRIVATE_WEBHOOKS": "1", "POSTTRAIN_ALERTS_RETRY_SECONDS": "1"}
    process = start_celery_worker(queue, studio_dirs, env)
    yield process
    process.terminate()
    process.wait(timeout=30)
    app.conf.task_default_queue = previous
    with app.connection_for_write() as connection:
        connection.default_channel.queue_delete(queue)


def wait_for_delivery(pk: int, timeout: float = 60.0) -> AlertDelivery:
    deadline = time.monotonic() + timeout
    while True:
        delivery = AlertDelivery.objects.get(pk=pk)
        if delivery.status != "pending" or time.monotonic() > deadline:
            return delivery
        time.sleep(0.1)


def test_a_worker_delivers_a_finished_runs_message_and_retries_a_failure(owner, worker):
    receiver = Receiver(statuses=[502])  # the first attempt fails, the retry is answered 200
    try:
        alert_settings_update(owner=owner, webhook_url=receiver.url)
        subscription_create(owner=owner, scope="all", channel="webhook")
        run = running_run(owner)
        run_finish(run_id=run.pk, status="succeeded")  # commits: the task goes to the broker
        delivery = wait_for_delivery(AlertDelivery.objects.get(run=run).pk)
        assert (delivery.status, delivery.attempts) == ("sent", 2), delivery.last_error
        assert len(receiver.bodies) == 2
        assert f"run #{run.pk}: succeeded" in receiver.bodies[-1]["json"]["text"]
    finally:
        receiver.close()
