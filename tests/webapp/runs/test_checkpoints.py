"""Checkpoints from the run page: the list, the Hugging Face folder as a streamed tar, and exports
and evaluations done by a worker process, never the web process (issue 39, item 10)."""

from __future__ import annotations

import io
import os
import tarfile
import time
from pathlib import Path

import pytest
from django.urls import reverse

from tests.webapp.fixtures import make_experiment
from tests.workers.test_lifecycle import tiny_cache  # noqa: F401  (a fixture)
from webapp.datasets.models import Dataset
from webapp.runs.checkpoints import (
    MAX_ACTIVE_JOBS_PER_USER,
    CheckpointJobRefused,
    archive_chunks,
    checkpoint_evaluate,
    checkpoint_export,
    checkpoint_job_claim,
    checkpoint_job_set_worker,
    checkpoint_jobs_mark_lost,
    run_checkpoints,
)
from webapp.runs.models import CheckpointJob, Run
from webapp.runs.services import run_create


def fake_checkpoint(run: Run, step: int, *, hf: bool) -> Path:
    """Write a complete checkpoint folder; with ``hf`` an actor/huggingface folder in it."""
    folder = Path(run.checkpoint_dir) / f"global_step_{step}"
    (folder / "actor").mkdir(parents=True)
    (folder / "trainer_state.pt").write_bytes(b"state")
    if hf:
        (folder / "actor" / "huggingface").mkdir()
        (folder / "actor" / "huggingface" / "config.json").write_text('{"model_type": "qwen2"}')
        (folder / "actor" / "huggingface" / "model.safetensors").write_bytes(os.urandom(3000))
    return folder


def test_the_archive_holds_the_folders_regular_files_and_no_link(tmp_path):
    folder = tmp_path / "hf"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    weights = os.urandom(5000)
    (folder / "sub" / "model.safetensors").write_bytes(weights)
    (tmp_path / "secret").write_text("outside")
    (folder / "link").symlink_to(tmp_path / "secret")
    (folder / "linked").symlink_to(tmp_path, target_is_directory=True)
    chunks = list(archive_chunks(folder, "run-1-step-2-hf"))
    assert max(len(c) for c in chunks) <= 1 << 20  # streamed in pieces
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        names = tar.getnames()
        assert names == ["run-1-step-2-hf/config.json", "run-1-step-2-hf/sub/model.safetensors"]
        assert tar.extractfile("run-1-step-2-hf/sub/model.safetensors").read() == weights


@pytest.mark.django_db
def test_the_run_page_lists_checkpoints_and_streams_a_saved_folder(client_in, owner, other_user):
    run = run_create(experiment=make_experiment(owner))
    page = client_in.get(run.get_absolute_url()).content.decode()
    assert "No checkpoint saved yet" in page
    fake_checkpoint(run, 1, hf=False)
    fake_checkpoint(run, 2, hf=True)
    assert [row.step for row in run_checkpoints(run=run)] == [2, 1]
    page = client_in.get(run.get_absolute_url()).content.decode()
    row = lambda step: page.split(f'data-checkpoint-step="{step}"')[1].split("</tr>")[0]  # noqa: E731
    archive = reverse("runs:checkpoint-archive", kwargs={"run_id": run.pk, "step": 2})
    assert f'href="{archive}"' in row(2) and "Prepare download" in row(1)
    response = client_in.get(archive)
    assert response["Content-Disposition"] == f'attachment; filename="run-{run.pk}-step-2-hf.tar"'
    with tarfile.open(fileobj=io.BytesIO(b"".join(response.streaming_content))) as tar:
        assert sorted(tar.getnames()) == [
            f"run-{run.pk}-step-2-hf/config.json",
            f"run-{run.pk}-step-2-hf/model.safetensors",
        ]
    assert client_in.get(archive.replace("/2/", "/1/")).status_code == 404  # no folder yet
    fragment = client_in.get(reverse("runs:checkpoints", kwargs={"run_id": run.pk}))
    assert fragment.content.decode().startswith('<section id="run-checkpoints"')
    client_in.force_login(other_user)
    assert client_in.get(archive).status_code == 404


@pytest.mark.django_db
def test_an_export_is_queued_once_and_refused_where_it_has_no_point(client_in, owner):
    run = run_create(experiment=make_experiment(owner))
    fake_checkpoint(run, 1, hf=False)
    fake_checkpoint(run, 2, hf=True)
    url = reverse("runs:checkpoint-export", kwargs={"run_id": run.pk, "step": 1})
    page = client_in.post(url, follow=True).content.decode()
    job = CheckpointJob.objects.get()
    assert (job.kind, job.status, job.step) == ("export", "queued", 1)
    assert "Preparing the Hugging Face folder of step 1" in page
    assert checkpoint_export(run=run, step=1, by=owner) == job  # the one already waiting
    with pytest.raises(CheckpointJobRefused, match="has its Hugging Face folder: download it"):
        checkpoint_export(run=run, step=2, by=owner)
    with pytest.raises(CheckpointJobRefused, match="no complete checkpoint at step 3"):
        checkpoint_export(run=run, step=3, by=owner)
    page = client_in.get(run.get_absolute_url()).content.decode()
    assert "writing the folder" in page.split('data-checkpoint-step="1"')[1].split("</tr>")[0]


@pytest.mark.django_db
def test_an_evaluation_is_queued_on_the_data_a_member_may_pick(client_in, owner, other_user):
    run = run_create(experiment=make_experiment(owner))
    fake_checkpoint(run, 1, hf=False)
    theirs = Dataset.objects.create(owner=other_user, name="theirs", file="x.jsonl", format="jsonl")
    url = reverse("runs:checkpoint-evaluate", kwargs={"run_id": run.pk, "step": 1})
    page = client_in.post(url, {"data": f"dataset:{theirs.pk}", "n": 1, "temperature": 1})
    assert page.status_code == 302 and not CheckpointJob.objects.exists()
    client_in.post(url, {"data": "val", "n": 4, "max_samples": 8, "temperature": 0.7})
    job = CheckpointJob.objects.get()
    assert (job.kind, job.status, job.step) == ("evaluate", "queued", 1)
    assert job.data_files == ["tiny://val.parquet"] and job.key_map == {}
    assert job.options == {
        "n": 4,
        "max_samples": 8,
        "temperature": 0.7,
        "file_key_maps": {},
        "file_data_sources": {},
    }
    assert job.dataset == "the run's validation files (tiny://val.parquet)"
    with pytest.raises(CheckpointJobRefused, match="temperature=0.0: sampling 4 responses"):
        checkpoint_evaluate(run=run, step=1, by=owner, data="val", n=4, temperature=0.0)
    with pytest.raises(CheckpointJobRefused, match="'/etc/passwd' is not one of this run's"):
        checkpoint_evaluate(run=run, step=1, by=owner, data="/etc/passwd")
    for _ in range(MAX_ACTIVE_JOBS_PER_USER - 1):
        checkpoint_evaluate(run=run, step=1, by=owner, data="train")
    with pytest.raises(CheckpointJobRefused, match="waiting or running; ask again once one ends"):
        checkpoint_evaluate(run=run, step=1, by=owner, data="train")


@pytest.mark.django_db
def test_a_member_evaluates_on_their_own_datasets_and_their_own_limit(client, owner, team):
    """Datasets and quotas stay each member's own: the checkpoints of a run in a project offer
    its editor the editor's datasets, never the run owner's, and count the job against the
    editor; a viewer is offered no form, so no dataset names at all."""
    bob, carol = team["bob"], team["carol"]
    run = run_create(experiment=team["experiment"])  # launched by its owner, alice
    fake_checkpoint(run, 1, hf=False)
    alices = Dataset.objects.create(
        owner=owner, name="alices-private", file="a.jsonl", format="jsonl"
    )
    bobs = Dataset.objects.create(owner=bob, name="bobs-own", file="b.jsonl", format="jsonl")
    url = reverse("runs:checkpoint-evaluate", kwargs={"run_id": run.pk, "step": 1})

    client.force_login(bob)
    page = client.get(run.get_absolute_url()).content.decode()
    assert "bobs-own" in page and "alices-private" not in page
    client.post(url, {"data": f"dataset:{alices.pk}", "n": 1, "temperature": 1})
    assert not CheckpointJob.objects.exists()  # not one of bob's choices
    client.post(url, {"data": f"dataset:{bobs.pk}", "n": 1, "temperature": 1})
    job = CheckpointJob.objects.get()
    assert job.requested_by == bob and job.dataset == "dataset bobs-own"
    for _ in range(MAX_ACTIVE_JOBS_PER_USER - 1):
        checkpoint_evaluate(run=run, step=1, by=bob, data="val")
    with pytest.raises(CheckpointJobRefused, match="waiting or running"):
        checkpoint_export(run=run, step=1, by=bob)
    assert checkpoint_export(run=run, step=1, by=owner).requested_by == owner  # alice's own

    client.force_login(carol)
    page = client.get(run.get_absolute_url()).content.decode()
    assert "bobs-own" in page  # the job's figures are the project's to read
    assert "alices-private" not in page and "evaluate-form" not in page
    assert "Prepare download" not in page


@pytest.mark.django_db
def test_an_evaluation_reads_each_file_as_the_run_or_the_dataset_reads_it(owner):
    from tests.webapp.experiments.test_data_contract import QA_MAP, SUMS, upload

    dataset = upload(owner, SUMS)
    run = run_create(experiment=make_experiment(owner, data__train_files=dataset.path))
    fake_checkpoint(run, 1, hf=False)
    on_train = checkpoint_evaluate(run=run, step=1, by=owner, data="train")
    assert on_train.data_files == [dataset.path] and on_train.key_map == {}
    assert on_train.options["file_key_maps"] == {dataset.path: QA_MAP}
    assert on_train.options["file_data_sources"] == {dataset.path: "tiny_arithmetic"}
    on_dataset = checkpoint_evaluate(run=run, step=1, by=owner, data=f"dataset:{dataset.pk}")
    assert on_dataset.key_map == QA_MAP
    assert on_dataset.options["file_data_sources"] == {dataset.path: "tiny_arithmetic"}


@pytest.mark.django_db
def test_a_job_whose_process_died_fails_with_the_end_of_its_output(owner):
    import subprocess
    import sys

    from webapp.runs.checkpoints import job_log_path

    run = run_create(experiment=make_experiment(owner))
    fake_checkpoint(run, 1, hf=False)
    job = checkpoint_export(run=run, step=1, by=owner)
    assert checkpoint_job_claim(job_id=job.pk, max_running=1) is not None
    assert checkpoint_job_claim(job_id=job.pk, max_running=0) is None  # running: not again
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
    )
    checkpoint_job_set_worker(job_id=job.pk, worker=f"pid:{int(gone.stdout)}")
    log = job_log_path(job)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("merging...\nKilled\n")
    assert checkpoint_jobs_mark_lost(timeout_s=45) == [job.pk]
    job.refresh_from_db()
    assert job.status == "failed" and job.error_summary.startswith("the job's process (pid")
    assert job.error.endswith("merging...\nKilled")


@pytest.mark.django_db
def test_a_job_whose_process_fell_silent_fails_on_any_host_once_its_beat_is_stale(owner):
    """A host that went away, or a worker killed between the claim and the process's start,
    leaves a running job no process on this host can vouch for: its beat decides."""
    import socket
    import subprocess
    import sys
    from datetime import timedelta

    run = run_create(experiment=make_experiment(owner))
    for step in (1, 2, 3, 4):
        fake_checkpoint(run, step, hf=False)
    never_started, elsewhere, before_beats, alive_here = (
        checkpoint_export(run=run, step=step, by=owner) for step in (1, 2, 3, 4)
    )
    for job in (never_started, elsewhere, before_beats, alive_here):
        assert checkpoint_job_claim(job_id=job.pk, max_running=0) is not None
    claimed = CheckpointJob.objects.get(pk=never_started.pk).heartbeat_at
    assert claimed is not None  # the claim starts the clock
    CheckpointJob.objects.filter(pk=elsewhere.pk).update(worker="pid:4242", worker_host="gone")
    CheckpointJob.objects.filter(pk=before_beats.pk).update(
        worker="pid:4243", worker_host="gone", heartbeat_at=None
    )
    # A live job process here whose beats an outage kept from the database.
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "-m", "workers.checkpoint_job"]
        + [str(alive_here.pk)]
    )
    try:
        deadline = time.monotonic() + 30
        while b"checkpoint_job" not in Path(f"/proc/{process.pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        checkpoint_job_set_worker(job_id=alive_here.pk, worker=f"pid:{process.pid}")
        assert CheckpointJob.objects.get(pk=alive_here.pk).worker_host == socket.gethostname()
        assert checkpoint_jobs_mark_lost(timeout_s=45, now=claimed + timedelta(seconds=44)) == []
        lost = checkpoint_jobs_mark_lost(timeout_s=45, now=claimed + timedelta(seconds=46))
    finally:
        process.kill()
        process.wait()
    assert sorted(lost) == [never_started.pk, elsewhere.pk]
    jobs = {job.pk: job for job in CheckpointJob.objects.filter(run=run)}
    assert jobs[never_started.pk].error == (
        "no heartbeat from the job's process for over 45 s: its host or its worker went away; "
        "ask for the job again"
    )
    assert jobs[elsewhere.pk].error.startswith(
        "no heartbeat from the job's process (pid:4242 on gone) for over 45 s"
    )
    assert jobs[before_beats.pk].status == "running"  # its process alone decides, on its host
    assert jobs[alive_here.pk].status == "running"


@pytest.mark.django_db(transaction=True)
def test_a_job_process_beats_its_heartbeat_while_it_works(owner):
    from datetime import timedelta

    from django.utils import timezone

    from workers.checkpoint_job import JobHeartbeat

    run = run_create(experiment=make_experiment(owner))
    fake_checkpoint(run, 1, hf=False)
    job = checkpoint_export(run=run, step=1, by=owner)
    checkpoint_job_claim(job_id=job.pk, max_running=0)
    old = timezone.now() - timedelta(minutes=5)
    CheckpointJob.objects.filter(pk=job.pk).update(heartbeat_at=old)
    heartbeat = JobHeartbeat(job.pk, 0.05)
    heartbeat.start()
    time.sleep(0.4)
    heartbeat.stop()
    heartbeat.join(5)
    beat = CheckpointJob.objects.get(pk=job.pk).heartbeat_at
    assert (timezone.now() - beat).total_seconds() < 2
    assert checkpoint_jobs_mark_lost(timeout_s=45) == []


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.django_db(transaction=True)
def test_a_checkpoint_is_evaluated_and_exported_by_a_worker_process(
    client_in,
    owner,
    tiny_cache,  # noqa: F811
):
    """A one-step tiny run saves a checkpoint without a Hugging Face folder; the dispatcher's
    process merges it, scores it with engine.eval, and its folder then downloads."""
    from engine.config import load_config
    from engine.trainer import PPOTrainer
    from workers.tasks import dispatch_checkpoint_jobs

    run = run_create(experiment=make_experiment(owner))
    config = load_config(
        "grpo_tiny.yaml",
        overrides=[
            "trainer.total_training_steps=1",
            "trainer.test_freq=-1",
            "trainer.val_before_train=False",
            "trainer.save_freq=1",
            "trainer.logger=[]",
            f"trainer.default_local_dir={run.checkpoint_dir}",
        ],
    )
    assert PPOTrainer(config).fit() == "succeeded"
    url = reverse("runs:checkpoint-evaluate", kwargs={"run_id": run.pk, "step": 1})
    client_in.post(url, {"data": "val", "n": 2, "max_samples": 6, "temperature": 1.0})
    job = CheckpointJob.objects.get()
    assert dispatch_checkpoint_jobs() == [job.pk]
    deadline = time.monotonic() + 420
    while job.is_active and time.monotonic() < deadline:
        time.sleep(1)
        job.refresh_from_db()
    assert job.status == "succeeded", job.error
    assert job.result["num_prompts"] == 6 and 0 <= job.result["greedy_accuracy"] <= 1
    assert set(job.result["sampled"]) >= {"val-core/tiny_arithmetic/reward/mean@2"}
    page = client_in.get(run.get_absolute_url()).content.decode()
    assert (
        f"{job.result['greedy_accuracy']:.4g}"[:4]
        in page.split('data-figure="greedy_accuracy">')[1]
    )
    archive = client_in.get(
        reverse("runs:checkpoint-archive", kwargs={"run_id": run.pk, "step": 1})
    )
    with tarfile.open(fileobj=io.BytesIO(b"".join(archive.streaming_content))) as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {"config.json", "model.safetensors", ".complete"} <= names


@pytest.mark.django_db(transaction=True)
def test_the_jobs_from_before_requested_by_count_against_their_runs_owner(owner):
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    run = run_create(experiment=make_experiment(owner))
    before = [("runs", "0009_sample_text_lz4")]
    after = [("runs", "0010_checkpointjob_requested_by")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old_job = executor.loader.project_state(before).apps.get_model("runs", "CheckpointJob")
    job = old_job.objects.create(run_id=run.pk, step=1, kind="export")
    try:
        executor = MigrationExecutor(connection)  # the graph again, as manage.py migrate reads it
        executor.migrate(after)
        # The model as it stood then: later migrations add columns the database lacks here.
        then = executor.loader.project_state(after).apps.get_model("runs", "CheckpointJob")
        assert then.objects.get(pk=job.pk).requested_by_id == owner.pk
    finally:  # every later migration back, for the tests after this one
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
