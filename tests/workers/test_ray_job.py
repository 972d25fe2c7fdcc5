"""A run whose driver is a Ray Job: ``RAY_ADDRESS`` names the job server of a real Ray head.

The head is started with ``ray start`` (its dashboard and job server on free ports, a temporary
folder of its own) in the environment of a bare host with the venv activated: no database, Redis
or Django variables, so what the driver needs can only arrive with the job. The Celery worker
(``test_lifecycle``'s) submits the driver; the run must go queued -> succeeded, and Ray's own job
client must agree. On a head whose ``python`` is not the studio's, the job fails before its
driver records anything, and the sweep marks the run lost at once with the job's log, as Ray's
job server tells it.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from functools import partial
from pathlib import Path

import pytest
from django.conf import settings
from django.urls import reverse

from tests.engine.distributed.ray_nodes import free_port, kill_node, start_head
from tests.webapp.fixtures import make_experiment
from tests.workers.test_lifecycle import SMALL, start_worker, tiny_cache, wait_for  # noqa: F401
from webapp.runs.models import MetricPoint, Run, RunStatus
from workers.ray_jobs import RayJobServer
from workers.tasks import database_url, mark_lost_runs

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def ray_head():
    """Start a two-CPU Ray head with its job server; kill exactly its processes afterwards."""
    head = start_head(num_cpus=2, dashboard=True)
    yield head
    kill_node(head)


def job_status(client, job_id: str, timeout: float):
    """Return the job's status once it is terminal (the driver exits after recording the end)."""
    deadline = time.monotonic() + timeout
    while not (status := client.get_job_status(job_id)).is_terminal():
        assert time.monotonic() < deadline, f"job {job_id} is still {status}"
        time.sleep(0.2)
    return status


def test_a_ray_job_run_goes_queued_to_succeeded(client, owner, start_worker, ray_head, monkeypatch):  # noqa: F811
    from ray.job_submission import JobStatus, JobSubmissionClient

    monkeypatch.setenv("RAY_ADDRESS", ray_head.dashboard)  # the worker's, as in docker-compose
    monkeypatch.setenv("POSTTRAIN_HEARTBEAT_TIMEOUT_S", "30")
    client.force_login(owner)
    experiment = make_experiment(
        owner,
        **SMALL,
        trainer__total_training_steps=2,
        trainer__val_before_train=False,
        trainer__test_freq=-1,
        trainer__controller="ray",  # the driver's ranks are actors on the same cluster
    )
    client.post(reverse("experiments:launch", kwargs={"experiment_id": experiment.pk}))
    run = Run.objects.get()
    assert run.status == RunStatus.QUEUED
    start_worker()
    jobs = JobSubmissionClient(ray_head.dashboard)
    try:
        seen = wait_for(run, lambda r: r.status == RunStatus.SUCCEEDED, 300, "succeed")
    except pytest.fail.Exception:
        job_id = f"posttrain-run-{run.pk}"
        print(jobs.get_job_logs(job_id) if jobs.list_jobs() else "(no job was submitted)")
        raise
    assert seen[0] == RunStatus.QUEUED and RunStatus.RUNNING in seen
    assert list(MetricPoint.objects.filter(run=run).values_list("step", flat=True)) == [1, 2]

    assert run.driver == f"ray:posttrain-run-{run.pk}"
    job_id = run.driver.removeprefix("ray:")
    assert job_status(jobs, job_id, 60) == JobStatus.SUCCEEDED
    info = jobs.get_job_info(job_id)
    assert info.entrypoint == f"python -m workers.driver {run.pk}"
    env = info.runtime_env["env_vars"]
    assert env["DATABASE_URL"] == database_url()  # the test database, not the node's default
    assert env["POSTTRAIN_DATA_DIR"] == str(settings.POSTTRAIN_DATA_DIR)
    assert env["POSTTRAIN_HEARTBEAT_TIMEOUT_S"] == "30"  # the sweep's timeout, known to the beat
    assert env["DJANGO_SECRET_KEY"] != os.environ["DJANGO_SECRET_KEY"]  # never the site's key
    assert f"run {run.pk}: succeeded" in jobs.get_job_logs(job_id)
    # The run page's log has it too: the driver's output in the run's folder.
    log = (Path(run.checkpoint_dir).parent / "driver.log").read_text()
    assert f"run {run.pk}: succeeded" in log and "step 2/2" in log


# A node started outside the studio's environment: its ``python`` cannot import Django.
NOT_THE_STUDIOS_PYTHON = """#!/bin/sh
echo 'Traceback (most recent call last):' >&2
echo "ModuleNotFoundError: No module named 'django'" >&2
exit 1
"""


@pytest.fixture(scope="module")
def head_without_the_studio(tmp_path_factory):
    """A Ray head with its job server whose jobs' ``python`` is not the studio's."""
    bin_dir = tmp_path_factory.mktemp("bin")
    (bin_dir / "python").write_text(NOT_THE_STUDIOS_PYTHON)
    (bin_dir / "python").chmod(0o755)
    head = start_head(num_cpus=2, dashboard=True, path_first=bin_dir)
    yield head
    kill_node(head)


def test_a_ray_job_that_fails_before_its_driver_records_is_lost_at_once_with_its_log(
    client,
    owner,
    start_worker,  # noqa: F811
    head_without_the_studio,
    monkeypatch,
    settings,
):
    from ray.job_submission import JobStatus, JobSubmissionClient

    address = head_without_the_studio.dashboard
    monkeypatch.setenv("RAY_ADDRESS", address)  # the worker submits there
    settings.RAY_ADDRESS = address  # and the sweep, in this process, asks there
    client.force_login(owner)
    experiment = make_experiment(owner, **SMALL, trainer__total_training_steps=2)
    client.post(reverse("experiments:launch", kwargs={"experiment_id": experiment.pk}))
    run = Run.objects.get()
    start_worker()
    wait_for(run, lambda r: r.driver.startswith("ray:"), 120, "be submitted")
    job_id = f"posttrain-run-{run.pk}"
    assert job_status(JobSubmissionClient(address), job_id, 60) == JobStatus.FAILED
    run.refresh_from_db()
    assert run.status == RunStatus.STARTING  # the driver never ran: nothing was recorded

    # A heartbeat timeout of an hour: only the job server's word can mark it lost now.
    settings.POSTTRAIN_HEARTBEAT_TIMEOUT_S = 3600
    assert mark_lost_runs() == [run.pk]  # the sweep, as beat runs it
    run.refresh_from_db()
    assert run.status == RunStatus.LOST
    assert run.error.startswith(
        f"the driver's Ray Job {job_id} ended without recording an end state: Ray says FAILED "
        "(Job entrypoint command failed with exit code 1)\n"
    )
    assert f"the end of its log (ray job logs {job_id}):" in run.error
    assert "ModuleNotFoundError: No module named 'django'" in run.error
    assert run.error.endswith("resume the run to continue from its last checkpoint")


def test_the_job_server_says_nothing_of_a_running_or_unknown_job_and_a_stopped_one_ended(
    head_without_the_studio,
):
    from ray.job_submission import JobStatus, JobSubmissionClient

    server = RayJobServer(head_without_the_studio.dashboard)
    jobs = JobSubmissionClient(head_without_the_studio.dashboard)
    job_id = jobs.submit_job(entrypoint="echo started; sleep 120")
    deadline = time.monotonic() + 60
    while jobs.get_job_status(job_id) != JobStatus.RUNNING:
        assert time.monotonic() < deadline, f"job {job_id} never ran"
        time.sleep(0.2)
    assert server.job_end(job_id) is None  # running: the heartbeat decides
    assert server.job_end("posttrain-run-never-submitted") is None  # 404: the heartbeat decides
    assert server.stop(job_id)
    assert job_status(jobs, job_id, 60) == JobStatus.STOPPED
    ended = server.job_end(job_id)
    assert ended is not None and ended.startswith("Ray says STOPPED")
    assert f"the end of its log (ray job logs {job_id}):\n" in ended
    assert "\nstarted\n" in ended + "\n"  # its output
    assert not server.silent

    down = RayJobServer(f"http://127.0.0.1:{free_port()}/")  # nothing listens there
    started = time.monotonic()
    assert down.job_end(job_id) is None and down.silent
    assert down.job_end(job_id) is None and not down.stop(job_id)  # not asked again
    assert time.monotonic() - started < 5
    assert RayJobServer("ray://127.0.0.1:10001").job_end(job_id) is None  # no job server's


def test_a_ray_job_driver_that_does_not_heed_a_cancel_is_stopped_through_the_job_server(
    owner, head_without_the_studio, settings
):
    from ray.job_submission import JobStatus, JobSubmissionClient

    from webapp.runs.driver_writes import runs_stop_unheeded_cancels
    from webapp.runs.services import run_cancel, run_create
    from workers.tasks import stop_driver

    server = RayJobServer(head_without_the_studio.dashboard)
    jobs = JobSubmissionClient(head_without_the_studio.dashboard)
    job_id = jobs.submit_job(entrypoint="trap '' TERM; sleep 600")  # heeds no request to stop
    run = run_create(experiment=make_experiment(owner))
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, driver=f"ray:{job_id}")
    run_cancel(run=Run.objects.get(pk=run.pk))
    asked = Run.objects.get(pk=run.pk).cancel_requested_at
    later = asked + timedelta(seconds=601)
    stop = partial(stop_driver, jobs=server)
    assert runs_stop_unheeded_cancels(stall_after=600, stop_driver=stop, now=later) == [run.pk]
    assert job_status(jobs, job_id, 60) == JobStatus.STOPPED  # Ray's SIGKILL after its SIGTERM
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert f"so the studio stopped it (ray job stop {job_id})" in run.error
