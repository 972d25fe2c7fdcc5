"""Services of runs against a real PostgreSQL: validation, lifecycle, sweep."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from engine.config import ConfigValidationError, set_value
from tests.webapp.fixtures import errors_by_key, make_experiment, tiny_config
from webapp.experiments.models import Experiment
from webapp.experiments.services import ExperimentBusy, experiment_delete
from webapp.runs.driver_writes import (
    run_claim_for_start,
    run_finish,
    run_mark_running,
    runs_mark_lost,
)
from webapp.runs.models import Run, RunStatus
from webapp.runs.services import RunStateError, run_cancel, run_create, run_delete, run_resume

pytestmark = pytest.mark.django_db


def write_checkpoint(run: Run, step: int) -> Path:
    folder = Path(run.checkpoint_dir) / f"global_step_{step}"
    folder.mkdir(parents=True)
    (folder / "trainer_state.pt").write_bytes(b"state")
    (Path(run.checkpoint_dir) / "latest_checkpointed_iteration.txt").write_text(str(step))
    return folder


def test_run_create_queues_a_numbered_run_with_its_own_checkpoint_folder(
    owner, studio_dirs, django_capture_on_commit_callbacks
):
    experiment = make_experiment(owner)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        first = run_create(experiment=experiment)
        second = run_create(experiment=experiment)
    assert (first.number, second.number) == (1, 2)
    assert first.status == RunStatus.QUEUED
    expected = studio_dirs / "data" / "runs" / str(first.pk) / "checkpoints"
    assert first.checkpoint_dir == str(expected)
    assert first.config["trainer"]["default_local_dir"] == str(expected)
    assert first.config["trainer"]["resume_mode"] == "disable"
    # one start_run dispatch and one status event per run, sent only after the commit
    assert len(callbacks) == 4


def test_a_folder_left_by_an_earlier_database_is_moved_aside(owner, studio_dirs):
    experiment = make_experiment(owner)
    run = run_create(experiment=experiment)
    stale = studio_dirs / "data" / "runs" / str(run.pk + 1) / "checkpoints" / "global_step_9"
    stale.mkdir(parents=True)
    fresh = run_create(experiment=experiment)
    assert fresh.pk == run.pk + 1
    assert not Path(fresh.checkpoint_dir).exists()
    moved = list((studio_dirs / "data" / "runs").glob(f"{fresh.pk}.orphaned-*"))
    assert len(moved) == 1 and (moved[0] / "checkpoints" / "global_step_9").is_dir()


def test_cancel_ends_a_queued_run_and_flags_a_running_one(owner):
    experiment = make_experiment(owner)
    queued = run_cancel(run=run_create(experiment=experiment))
    assert queued.status == RunStatus.CANCELLED and queued.finished_at is not None
    running = run_create(experiment=experiment)
    run_claim_for_start(run_id=running.pk)
    run_mark_running(run_id=running.pk)
    running = run_cancel(run=running)
    assert running.status == RunStatus.RUNNING and running.cancel_requested


def test_claiming_a_run_twice_starts_it_once(owner):
    run = run_create(experiment=make_experiment(owner))
    assert run_claim_for_start(run_id=run.pk).status == RunStatus.STARTING
    assert run_claim_for_start(run_id=run.pk) is None
    run_cancel(run=run_create(experiment=run.experiment))
    assert run_claim_for_start(run_id=run.pk + 1) is None


def test_resume_continues_from_the_last_checkpoint_in_a_linked_run(owner):
    parent = run_create(experiment=make_experiment(owner))
    run_claim_for_start(run_id=parent.pk)
    run_mark_running(run_id=parent.pk)
    with pytest.raises(RunStateError, match="only a cancelled, failed or lost run resumes"):
        run_resume(run=Run.objects.get(pk=parent.pk))
    run_finish(run_id=parent.pk, status="cancelled")
    parent.refresh_from_db()
    with pytest.raises(RunStateError, match="saved no checkpoint"):
        run_resume(run=parent)
    write_checkpoint(parent, 2)
    checkpoint = write_checkpoint(parent, 5)
    child = run_resume(run=parent)
    assert child.parent == parent and child.number == 2 and child.status == RunStatus.QUEUED
    assert child.config["trainer"]["resume_mode"] == "resume_path"
    assert child.config["trainer"]["resume_from_path"] == str(checkpoint)
    assert child.checkpoint_dir != parent.checkpoint_dir


def test_mark_lost_takes_only_driver_runs_with_a_stale_heartbeat(owner):
    experiment = make_experiment(owner)
    now = timezone.now()
    runs = {}
    for name, status, age in [
        ("stale", RunStatus.RUNNING, 300),
        ("fresh", RunStatus.RUNNING, 30),
        ("starting", RunStatus.STARTING, 121),
        ("queued", RunStatus.QUEUED, 999),
        ("done", RunStatus.SUCCEEDED, 999),
    ]:
        run = run_create(experiment=experiment)
        Run.objects.filter(pk=run.pk).update(
            status=status, heartbeat_at=now - timedelta(seconds=age)
        )
        runs[name] = run.pk
    lost = runs_mark_lost(timeout_s=120, now=now)
    assert sorted(lost) == sorted([runs["stale"], runs["starting"]])
    status = dict(Run.objects.values_list("pk", "status"))
    assert status[runs["stale"]] == RunStatus.LOST and status[runs["fresh"]] == RunStatus.RUNNING
    assert (
        status[runs["queued"]] == RunStatus.QUEUED and status[runs["done"]] == RunStatus.SUCCEEDED
    )
    assert "resume the run" in Run.objects.get(pk=runs["stale"]).error
    assert runs_mark_lost(timeout_s=120, now=now) == []


def test_finish_records_the_end_once_even_after_a_lost_mark(owner):
    run = run_create(experiment=make_experiment(owner))
    Run.objects.filter(pk=run.pk).update(status=RunStatus.LOST)
    assert run_finish(run_id=run.pk, status="failed", error="Traceback ...\nValueError: x")
    assert not run_finish(run_id=run.pk, status="succeeded")
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.error.endswith("ValueError: x")
    with pytest.raises(ValueError, match="finishes as succeeded, failed or cancelled"):
        run_finish(run_id=run.pk, status="lost")


def test_delete_refuses_active_runs_and_removes_finished_ones_with_their_files(owner):
    experiment = make_experiment(owner)
    run = run_create(experiment=experiment)
    with pytest.raises(RunStateError, match="cancel it before deleting"):
        run_delete(run=run)
    with pytest.raises(ExperimentBusy, match="still active"):
        experiment_delete(experiment=experiment)
    run = run_cancel(run=run)
    folder = write_checkpoint(run, 1).parent.parent
    experiment_delete(experiment=experiment)
    assert not Run.objects.exists() and not Experiment.objects.exists()
    assert not folder.exists()


def test_run_create_validates_the_config_it_is_given(owner):
    experiment = make_experiment(owner)
    config = tiny_config()
    set_value(config, "trainer.save_freq", 0)
    with pytest.raises(ConfigValidationError) as exc:
        run_create(experiment=experiment, config=config)
    assert errors_by_key(exc.value) == {
        "trainer.save_freq": "must be -1 (off) or a positive number of steps"
    }
    assert not Run.objects.exists()
