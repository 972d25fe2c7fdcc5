"""RunRecorder against a real PostgreSQL and Redis: metric upsert, COPY of samples, events."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer

from engine.trainer.reporting import SampleRecord
from tests.webapp.fixtures import make_experiment
from webapp.runs.driver_writes import (
    metric_point_upsert,
    run_claim_for_start,
    run_mark_running,
    samples_write,
)
from webapp.runs.models import MetricPoint, Run, RunStatus, Sample
from webapp.runs.services import run_create
from workers.database_recorder import RunRecorder
from workers.publish import RunEventPublisher

pytestmark = pytest.mark.django_db


@pytest.fixture
def running_run(owner):
    run = run_create(experiment=make_experiment(owner))
    run_claim_for_start(run_id=run.pk)
    return run_mark_running(run_id=run.pk)


def sample(step: int, prompt: int, index: int, **fields) -> SampleRecord:
    values = dict(
        step=step,
        split="train",
        prompt_index=prompt,
        sample_index=index,
        group_id=f"g{prompt}",
        data_source="tiny_arithmetic",
        prompt_text="12+30=",
        response_text="42",
        ground_truth="42",
        reward=1.0,
        reward_parts={"tiny_arithmetic": 1.0},
        advantage=0.5,
        response_length=3,
        tokens=["4", "2", "</s>"],
        token_logprobs=[-0.25, -1.5, -0.125],
        token_ref_logprobs=[-0.5, -1.0, -0.25],
        token_advantages=[0.5, 0.5, 0.5],
    )
    values.update(fields)
    return SampleRecord(**values)


def test_metric_upsert_keeps_one_row_per_step_and_stores_nan_as_null(running_run):
    metric_point_upsert(run_id=running_run.pk, step=3, metrics={"critic/score/mean": 0.25})
    metric_point_upsert(
        run_id=running_run.pk,
        step=3,
        metrics={"critic/score/mean": np.float32(0.75), "actor/kl_loss": float("nan")},
    )
    point = MetricPoint.objects.get(run=running_run)
    assert point.step == 3
    assert point.metrics == {"critic/score/mean": 0.75, "actor/kl_loss": None}


def test_copy_writes_samples_with_compact_per_token_arrays(running_run):
    records = [
        sample(1, 0, 0),
        sample(
            1,
            0,
            1,
            response_text="4\x002",
            reward=float("nan"),
            token_ref_logprobs=None,
            token_advantages=None,
            reward_parts={"x": float("inf")},
        ),
        sample(1, 1, 0, split="val", advantage=None, tokens=['"a\tb"', "NULL", "\\"]),
    ]
    assert samples_write(run_id=running_run.pk, samples=records) == 3
    assert samples_write(run_id=running_run.pk, samples=[]) == 0
    rows = list(
        Sample.objects.filter(run=running_run).order_by("split", "prompt_index", "sample_index")
    )
    first, second, val = rows
    assert first.token_logprobs == [-0.25, -1.5, -0.125]
    assert first.token_ref_logprobs == [-0.5, -1.0, -0.25]
    assert first.reward_parts == {"tiny_arithmetic": 1.0} and first.advantage == 0.5
    assert second.response_text == "4\ufffd2" and math.isnan(second.reward)
    assert second.token_ref_logprobs is None and second.token_advantages is None
    assert second.reward_parts == {"x": None}
    assert val.split == "val" and val.advantage is None
    assert val.tokens == ['"a\tb"', "NULL", "\\"]
    # float4 keeps about 7 significant digits: the arrays are stored as real[], not float8[]
    samples_write(run_id=running_run.pk, samples=[sample(2, 0, 0, token_logprobs=[0.1])])
    stored = Sample.objects.get(run=running_run, step=2).token_logprobs[0]
    assert stored == pytest.approx(0.1, rel=1e-6)


def test_recorder_records_steps_beats_heartbeat_and_polls_cancel(running_run):
    recorder = RunRecorder(running_run.pk)
    recorder.on_start(config={}, total_steps=5, start_step=0)
    Run.objects.filter(pk=running_run.pk).update(heartbeat_at=None)
    recorder.on_step(1, {"critic/score/mean": 0.5})
    recorder.on_samples(1, [sample(1, 0, 0), sample(1, 0, 1)])
    run = Run.objects.get(pk=running_run.pk)
    assert (run.total_steps, run.latest_step) == (5, 1)
    assert run.heartbeat_at is not None
    assert Sample.objects.filter(run=run).count() == 2
    assert not recorder.should_stop()
    Run.objects.filter(pk=run.pk).update(cancel_requested=True)
    assert recorder.should_stop()
    recorder.on_checkpoint(1, "/ckpt/global_step_1")
    recorder.on_finish(status="cancelled")
    recorder.on_finish(status="failed", error="ignored: the run already ended")
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.error == ""
    assert run.latest_checkpoint == "/ckpt/global_step_1"


def test_a_run_that_stopped_running_asks_the_trainer_to_stop(running_run):
    recorder = RunRecorder(running_run.pk)
    assert not recorder.should_stop()
    Run.objects.filter(pk=running_run.pk).update(status=RunStatus.LOST)
    assert recorder.should_stop()


def test_events_reach_the_run_group_over_redis(running_run):
    layer = get_channel_layer()
    publisher = RunEventPublisher(layer)
    loop = publisher.loop
    channel = loop.run_until_complete(layer.new_channel())
    loop.run_until_complete(layer.group_add(running_run.group_name, channel))
    try:
        recorder = RunRecorder(running_run.pk, publisher)
        recorder.on_step(2, {"critic/score/mean": 0.5, "actor/pg_loss": float("nan")})
        recorder.on_samples(2, [sample(2, 0, 0, reward=1.0), sample(2, 0, 1, reward=0.0)])
        metrics = loop.run_until_complete(asyncio.wait_for(layer.receive(channel), 5))
        samples = loop.run_until_complete(asyncio.wait_for(layer.receive(channel), 5))
    finally:
        loop.run_until_complete(layer.group_discard(running_run.group_name, channel))
        publisher.close()
    assert running_run.group_name == f"run.{running_run.pk}"
    assert metrics["type"] == "run.event" and metrics["event"] == "metrics"
    assert metrics["step"] == 2 and metrics["metrics"] == {
        "critic/score/mean": 0.5,
        "actor/pg_loss": None,
    }
    assert samples["event"] == "samples" and samples["count"] == 2
    assert samples["reward_mean"] == 0.5 and samples["split"] == "train"


def test_a_publishing_failure_never_stops_the_recording(running_run):
    dead = RedisChannelLayer(hosts=["redis://127.0.0.1:1/0"])
    publisher = RunEventPublisher(dead, timeout_s=2)
    recorder = RunRecorder(running_run.pk, publisher)
    recorder.on_step(1, {"critic/score/mean": 1.0})
    publisher.close()
    assert publisher.failures == 1
    assert MetricPoint.objects.filter(run=running_run, step=1).exists()
    assert not publisher.publish({"run_id": running_run.pk, "event": "status"})
