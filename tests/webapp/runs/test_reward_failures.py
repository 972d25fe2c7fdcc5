"""A run whose rewards all fail is not a success: it stops and ends failed, saying why (issue 39).

The tiny preset's step has 32 prompts x 8 responses = 256 samples; the rule's defaults are more
than half of them failing in each of 3 steps in a row.
"""

from __future__ import annotations

import pytest
from django.urls import reverse

from engine.trainer.reporting import SampleRecord
from tests.webapp.fixtures import make_experiment
from webapp.runs.driver_writes import (
    run_claim_for_start,
    run_finish,
    run_mark_running,
    run_record_step,
    run_should_stop,
)
from webapp.runs.models import Run, RunStatus
from webapp.runs.reward_failures import failed_share
from webapp.runs.services import run_create

pytestmark = pytest.mark.django_db

SAMPLES = 256  # grpo_tiny: data.train_batch_size 32 x rollout.n 8
ERROR = "NotImplementedError: no reward function for data_source 'my_upload'"


@pytest.fixture
def running(owner):
    run = run_create(experiment=make_experiment(owner))
    assert (
        run.config["data"]["train_batch_size"] * run.config["actor_rollout_ref"]["rollout"]["n"]
        == SAMPLES
    )
    run_claim_for_start(run_id=run.pk)
    run_mark_running(run_id=run.pk)
    return run


def failing_sample(step: int) -> SampleRecord:
    return SampleRecord(
        step=step, split="train", prompt_index=0, sample_index=0, group_id="g",
        data_source="my_upload", prompt_text="1+1=", response_text="2", ground_truth="2",
        reward=0.0, reward_error=f"{ERROR}\nTraceback (most recent call last): ...",
    )  # fmt: skip


def record(run: Run, step: int, failed: int) -> None:
    metrics = {"critic/score/mean": 0.0, **({"reward/failed": float(failed)} if failed else {})}
    run_record_step(run_id=run.pk, step=step, samples=[failing_sample(step)], metrics=metrics)


def test_failed_share_is_the_share_of_the_steps_samples():
    assert failed_share({"reward/failed": 64.0}, SAMPLES) == 0.25
    assert failed_share({}, SAMPLES) == 0.0
    assert failed_share({"reward/failed": 300.0}, SAMPLES) == 1.0
    assert failed_share({"reward/failed": float("nan")}, SAMPLES) == 0.0


def test_three_steps_of_failing_rewards_stop_the_run_and_it_ends_failed_saying_why(
    running, client_in
):
    for step in (1, 2):
        record(running, step, failed=SAMPLES)
        assert not run_should_stop(run_id=running.pk)
    record(running, 3, failed=133)  # just over half
    assert run_should_stop(run_id=running.pk)
    reason = Run.objects.get(pk=running.pk).failure_reason
    assert reason.startswith(
        "the reward function failed on more than 50% of the samples in each of steps 1-3 "
        "(52% at step 3), so the run stopped"
    )
    assert f'One of the errors: "{ERROR}". Each sample' in reason
    assert "POSTTRAIN_REWARD_FAILURE_RATE and POSTTRAIN_REWARD_FAILURE_STEPS" in reason
    # The trainer stops as it does for a cancel; the run ends failed with the reason.
    assert run_finish(run_id=running.pk, status="cancelled")
    run = Run.objects.get(pk=running.pk)
    assert run.status == RunStatus.FAILED and run.error == reason
    page = client_in.get(reverse("runs:detail", kwargs={"run_id": run.pk})).content.decode()
    assert "so the run stopped: it was learning from zero rewards" in page


def test_a_step_whose_rewards_mostly_work_breaks_the_streak(running):
    record(running, 1, failed=SAMPLES)
    record(running, 2, failed=SAMPLES)
    record(running, 3, failed=128)  # exactly half: not more than half
    record(running, 4, failed=SAMPLES)
    record(running, 5, failed=SAMPLES)
    assert not run_should_stop(run_id=running.pk)
    assert run_finish(run_id=running.pk, status="succeeded")
    assert Run.objects.get(pk=running.pk).status == RunStatus.SUCCEEDED


def test_a_run_too_short_for_the_streak_whose_every_step_failed_ends_failed(running):
    record(running, 1, failed=SAMPLES)
    record(running, 2, failed=SAMPLES)
    assert not run_should_stop(run_id=running.pk)
    assert run_finish(run_id=running.pk, status="succeeded")
    run = Run.objects.get(pk=running.pk)
    assert run.status == RunStatus.FAILED
    assert "in each of steps 1-2 (100% at step 2)" in run.error


def test_a_real_failure_keeps_its_own_error_and_the_rule_can_be_turned_off(owner, settings):
    run = run_create(experiment=make_experiment(owner))
    run_claim_for_start(run_id=run.pk)
    run_mark_running(run_id=run.pk)
    settings.POSTTRAIN_REWARD_FAILURE_RATE = 1  # off
    for step in (1, 2, 3):
        record(run, step, failed=SAMPLES)
    assert not run_should_stop(run_id=run.pk)
    assert run_finish(run_id=run.pk, status="failed", error="RuntimeError: out of memory")
    assert Run.objects.get(pk=run.pk).error == "RuntimeError: out of memory"


def test_the_rule_reads_its_settings(running, settings):
    settings.POSTTRAIN_REWARD_FAILURE_STEPS = 1
    settings.POSTTRAIN_REWARD_FAILURE_RATE = 0.2
    record(running, 1, failed=40)  # 16%: under
    assert not run_should_stop(run_id=running.pk)
    record(running, 2, failed=57)  # 22%: over, one step is enough
    assert run_should_stop(run_id=running.pk)
    assert "in step 2 (22% at step 2)" in Run.objects.get(pk=running.pk).failure_reason
