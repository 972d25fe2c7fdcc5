"""The driver in-process, for the paths that end before training: each leaves a clear record."""

from __future__ import annotations

import pytest

from tests.webapp.fixtures import make_experiment
from webapp.runs.driver_writes import run_claim_for_start
from webapp.runs.models import Run, RunStatus
from webapp.runs.services import run_create
from workers.driver import drive

pytestmark = pytest.mark.django_db


@pytest.fixture
def starting_run(owner):
    run = run_create(experiment=make_experiment(owner))
    return run_claim_for_start(run_id=run.pk)


def test_a_run_that_is_not_starting_is_left_alone(owner):
    run = run_create(experiment=make_experiment(owner))
    assert drive(run.pk, publish=False) == "skipped"
    assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED


def test_a_cancel_before_the_start_ends_the_run_without_training(starting_run):
    Run.objects.filter(pk=starting_run.pk).update(cancel_requested=True)
    assert drive(starting_run.pk, publish=False) == "cancelled"
    run = Run.objects.get(pk=starting_run.pk)
    assert run.status == RunStatus.CANCELLED
    assert run.started_at is not None and run.finished_at is not None


def test_a_config_the_engine_cannot_read_fails_the_run_with_its_traceback(starting_run):
    config = dict(starting_run.config)
    config["trainer"] = {**config["trainer"], "bogus_key": 1}
    Run.objects.filter(pk=starting_run.pk).update(config=config)
    assert drive(starting_run.pk, publish=False) == "failed"
    run = Run.objects.get(pk=starting_run.pk)
    assert run.status == RunStatus.FAILED
    assert run.error.startswith("Traceback (most recent call last):")
    assert "trainer.bogus_key" in run.error


@pytest.mark.django_db(transaction=True)
def test_a_driver_whose_output_goes_elsewhere_writes_it_to_the_runs_log(owner, settings):
    """A Ray Job's driver prints to Ray's pipe: from the moment it reads its run, its stdout and
    stderr also go to the run's driver.log, which the run page tails."""
    import subprocess
    import sys

    from webapp.runs.logs import run_log_path
    from workers.tasks import driver_env

    run = run_create(experiment=make_experiment(owner))  # queued: the driver skips it
    done = subprocess.run(
        [sys.executable, "-m", "workers.driver", str(run.pk)],
        cwd=settings.BASE_DIR,
        env=driver_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    log = run_log_path(run).read_text()
    assert f"run {run.pk}: skipped" in log and f"run {run.pk}: skipped" in done.stdout
    assert "is not starting; nothing to do" in log  # the driver's logging (stderr) too
