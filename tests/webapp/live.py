"""Helpers for the live-monitoring tests: running runs with recorded steps, a private layer prefix."""

from __future__ import annotations

import copy
import math
import os
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection

from tests.webapp.fixtures import make_experiment
from webapp.runs.models import MetricPoint, Run, RunStatus

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def private_channel_layers(layers: dict[str, Any]) -> dict[str, Any]:
    """Return the studio's CHANNEL_LAYERS with a key prefix no other test process shares.

    Run ids restart at 1 in every test database, so two test sessions on one Redis would
    otherwise hear each other's ``run.<id>`` groups.
    """
    private = copy.deepcopy(layers)
    private["default"]["CONFIG"]["prefix"] = f"test-live-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return private


# A socket test: a database its consumers' threads see, a bound on a hung socket, and a channel
# layer and database connections of its own (the fixtures below).
SOCKET_TEST_MARKS = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(60),
    pytest.mark.usefixtures("private_redis_layer", "short_lived_connections"),
]


@pytest.fixture
def private_redis_layer(settings: Any) -> None:
    """Give the test's channel layer a key prefix of its own (a socket test's autouse fixture)."""
    settings.CHANNEL_LAYERS = private_channel_layers(settings.CHANNEL_LAYERS)


@pytest.fixture
def short_lived_connections() -> Any:
    """Let the consumer's database thread close its connections, so the test database can go."""
    settings_dict = connection.settings_dict
    kept = settings_dict["CONN_MAX_AGE"]
    settings_dict["CONN_MAX_AGE"] = 0
    yield
    settings_dict["CONN_MAX_AGE"] = kept


def running_run(
    owner: Any, *, total_steps: int = 100, number: int = 1, t0: datetime = T0, **fields: Any
) -> Run:
    """Create a run row that a driver is running since ``t0`` (no task is queued)."""
    experiment = fields.pop("experiment", None) or make_experiment(owner)
    values = dict(
        experiment=experiment,
        owner=owner,
        number=number,
        status=RunStatus.RUNNING,
        config={},
        started_at=t0,
        heartbeat_at=t0,
        total_steps=total_steps,
    )
    values.update(fields)
    return Run.objects.create(**values)


def step_metrics(step: int) -> dict[str, float]:
    """Return the metrics a tiny GRPO step would record, as a function of the step."""
    return {
        "critic/score/mean": round(math.sin(step / 50.0), 6),
        "critic/score/max": 1.0,
        "critic/score/min": -1.0,
        "actor/kl_loss": step / 1000.0,
        "actor/entropy": 2.0 - step / 10000.0,
        "response_length/mean": float(10 + step % 7),
        "timing_s/gen": 0.25,
    }


def record_steps(run: Run, steps: range, t0: datetime = T0) -> None:
    """Store one ``MetricPoint`` per step, ``step`` seconds after ``t0``."""
    MetricPoint.objects.bulk_create(
        [
            MetricPoint(
                run=run,
                step=step,
                wall_time=t0 + timedelta(seconds=step),
                metrics=step_metrics(step),
            )
            for step in steps
        ],
        batch_size=2000,
    )
    Run.objects.filter(pk=run.pk).update(latest_step=steps[-1])
