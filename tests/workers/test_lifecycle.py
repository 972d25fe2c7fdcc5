"""The whole lifecycle with real services: web form -> PostgreSQL -> Redis -> Celery worker ->
driver process -> engine (on Ray) -> recorder -> PostgreSQL; then cancel and resume.

A Celery worker subprocess serves a queue of its own (so no other worker on the machine takes
these tasks) against the pytest database. The tiny model comes from the shared asset cache,
linked into the test's own data folder so run folders never mix with other runs. The waits are
upper bounds for a loaded shared machine; on an idle 2-core machine each test takes under a minute.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from django.conf import settings
from django.urls import reverse

from tests.vllm_tests import requires_vllm
from tests.webapp.fixtures import builder_data, make_experiment, tiny_config
from tests.workers.celery_worker import start_celery_worker
from webapp.runs.models import MetricPoint, Run, RunStatus, Sample
from webapp.runs.selectors import run_latest_checkpoint
from workers.celery_app import app

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# Small, quiet runs whatever the preset says: 8 prompts x 4 samples a step, no validation before
# training, no periodic checkpoints.
SMALL = {
    "data__train_batch_size": 8,
    "actor_rollout_ref__actor__ppo_mini_batch_size": 8,
    "actor_rollout_ref__rollout__n": 4,
    "trainer__save_freq": -1,
}


@pytest.fixture
def tiny_cache(studio_dirs: Path) -> Path:
    from engine.env import data_dir
    from engine.tiny import ensure_tiny_assets

    shared = data_dir()
    ensure_tiny_assets(shared)
    data = Path(settings.POSTTRAIN_DATA_DIR)
    data.mkdir(parents=True, exist_ok=True)
    (data / "tiny").symlink_to(shared / "tiny", target_is_directory=True)
    return data


@pytest.fixture
def start_worker(tiny_cache: Path, studio_dirs: Path):
    """Return a function that starts the Celery worker; stop it and every driver afterwards."""
    queue = f"posttrain-test-{uuid.uuid4().hex[:12]}"
    previous = app.conf.task_default_queue
    app.conf.task_default_queue = queue
    processes: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        env = {
            "POSTTRAIN_DATA_DIR": str(tiny_cache),
            "POSTTRAIN_REWARD_MODULES_DIR": str(settings.POSTTRAIN_REWARD_MODULES_DIR),
        }
        processes.append(start_celery_worker(queue, studio_dirs, env))
        return processes[-1]

    yield start
    for run in Run.objects.exclude(driver=""):
        stop_driver(run)
    for process in processes:
        process.terminate()
        process.wait(timeout=30)
    app.conf.task_default_queue = previous
    with app.connection_for_write() as connection:
        connection.default_channel.queue_delete(queue)


def stop_driver(run: Run) -> None:
    """Kill the run's driver process group if that pid is still this run's driver."""
    if not run.driver.startswith("pid:"):
        return
    pid = int(run.driver[4:])
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return
    if b"workers.driver" in command and str(run.pk).encode() in command:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def wait_for(run: Run, done: Callable[[Run], bool], timeout: float, what: str) -> list[str]:
    """Poll the run until ``done``; return the statuses seen. Fail with the driver's log."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        run.refresh_from_db()
        if not seen or seen[-1] != run.status:
            seen.append(run.status)
        if done(run):
            return seen
        if time.monotonic() > deadline or (
            run.status not in (RunStatus.QUEUED, RunStatus.STARTING, RunStatus.RUNNING)
            and not done(run)
        ):
            log = Path(settings.POSTTRAIN_DATA_DIR) / "runs" / str(run.pk) / "driver.log"
            tail = log.read_text()[-4000:] if log.exists() else "(no driver log)"
            pytest.fail(f"run {run.pk} did not {what}: statuses {seen}\n{run.error}\n{tail}")
        time.sleep(0.1)


def test_a_tiny_grpo_run_goes_from_the_web_form_to_succeeded(client, owner, start_worker):
    client.force_login(owner)
    config = tiny_config(
        **SMALL,
        trainer__total_training_steps=3,
        trainer__test_freq=3,
        trainer__controller="ray",  # the driver runs the engine's Ray worker groups
    )
    data = builder_data(config, owner, trainer__val_before_train=None)
    response = client.post(reverse("experiments:new"), data)
    run = Run.objects.get()
    assert response.status_code == 302 and run.status == RunStatus.QUEUED
    start_worker()
    seen = wait_for(run, lambda r: r.status == RunStatus.SUCCEEDED, 900, "succeed")
    assert seen[0] == RunStatus.QUEUED and RunStatus.RUNNING in seen
    assert seen[-1] == RunStatus.SUCCEEDED
    assert run.started_at and run.finished_at and run.error == ""
    assert (run.latest_step, run.total_steps) == (3, 3)
    points = list(MetricPoint.objects.filter(run=run).order_by("step"))
    assert [p.step for p in points] == [1, 2, 3]
    for point in points:
        assert {"critic/score/mean", "actor/pg_loss", "response_length/mean"} <= set(point.metrics)
    per_step = 8 * 4  # train_batch_size prompts x rollout.n responses
    for step in (1, 2, 3):
        assert Sample.objects.filter(run=run, split="train", step=step).count() == per_step
    assert Sample.objects.filter(run=run, split="val", step=3).exists()
    sample = Sample.objects.filter(run=run, split="train").first()
    assert len(sample.token_logprobs) == len(sample.tokens) == sample.response_length
    first = Sample.objects.filter(run=run, step=1, split="train").first()
    group = Sample.objects.filter(run=run, step=1, split="train", prompt_index=first.prompt_index)
    assert sorted(group.values_list("sample_index", flat=True)) == [0, 1, 2, 3]
    assert set(group.values_list("group_id", flat=True)) == {first.group_id}


def test_cancel_stops_within_a_step_and_resume_continues_the_numbering(client, owner, start_worker):
    client.force_login(owner)
    experiment = make_experiment(
        owner,
        **SMALL,
        trainer__total_training_steps=500,
        trainer__val_before_train=False,
        trainer__test_freq=-1,
    )
    start_worker()
    client.post(reverse("experiments:launch", kwargs={"experiment_id": experiment.pk}))
    parent = Run.objects.get()
    wait_for(parent, lambda r: r.latest_step >= 2, 600, "reach step 2")
    client.post(reverse("runs:cancel", kwargs={"run_id": parent.pk}))
    parent.refresh_from_db()
    step_at_cancel = parent.latest_step
    wait_for(parent, lambda r: r.status == RunStatus.CANCELLED, 300, "stop after the cancel")
    last = max(MetricPoint.objects.filter(run=parent).values_list("step", flat=True))
    # The step in progress when the cancel landed (recorded latest + 1) may already have passed
    # its cancel check; the one after it may not.
    assert step_at_cancel <= last <= step_at_cancel + 2
    checkpoint = run_latest_checkpoint(run=parent)
    assert checkpoint is not None and checkpoint.name == f"global_step_{last}"

    response = client.post(reverse("runs:resume", kwargs={"run_id": parent.pk}))
    child = Run.objects.get(parent=parent)
    assert response["Location"] == child.get_absolute_url()
    wait_for(child, lambda r: r.latest_step >= last + 1, 600, "record a step after resuming")
    client.post(reverse("runs:cancel", kwargs={"run_id": child.pk}))
    wait_for(child, lambda r: r.status == RunStatus.CANCELLED, 300, "stop after the cancel")
    steps = list(
        MetricPoint.objects.filter(run=child).order_by("step").values_list("step", flat=True)
    )
    assert steps[0] == last + 1 and steps == list(range(last + 1, steps[-1] + 1))
    assert child.start_step == last
    assert not Sample.objects.filter(run=child, step__lte=last).exists()


@requires_vllm
def test_a_vllm_run_from_the_builder_records_samples_and_token_colours_as_hf(
    client, owner, start_worker
):
    from webapp.samples.selectors import token_rows

    client.force_login(owner)
    config = tiny_config(
        **SMALL,
        trainer__total_training_steps=2,
        trainer__test_freq=2,
        actor_rollout_ref__rollout__name="vllm",
    )
    data = builder_data(config, owner, trainer__val_before_train=None)
    response = client.post(reverse("experiments:new"), data)
    run = Run.objects.get()
    assert response.status_code == 302, response.content.decode()[-2000:]
    assert run.config["actor_rollout_ref"]["rollout"]["name"] == "vllm"
    start_worker()
    wait_for(run, lambda r: r.status == RunStatus.SUCCEEDED, 900, "succeed")
    assert [p.step for p in MetricPoint.objects.filter(run=run).order_by("step")] == [1, 2]
    assert Sample.objects.filter(run=run, split="train", step=2).count() == 8 * 4
    assert Sample.objects.filter(run=run, split="val", step=2).exists()
    samples = list(Sample.objects.filter(run=run, split="train", step=1)[:4])
    for row, sample in zip(token_rows(samples), samples, strict=True):
        # The inspector colours each token by vLLM's log-prob of it, as for hf.
        assert len(row["logprob"]) == len(row["tokens"]) == sample.response_length > 0
        assert all(v is not None and v <= 0 for v in row["logprob"])
