"""An external run's config is data to show: launch, resume, clone and sweep refuse it, over the
pages and the API; cancel is asked of the client only when it said it stops the job."""

from __future__ import annotations

import pytest

from tests.webapp.api.helpers import errors_of
from webapp.external.services import external_run_create
from webapp.runs.driver_writes import run_claim_for_start
from webapp.runs.models import Run, RunStatus
from webapp.runs.services import ExternalRunRefused, run_cancel, run_create, run_resume

pytestmark = pytest.mark.django_db

# A config that would, if it were ever run here, read another machine's paths and load code.
HOSTILE_CONFIG = {
    "data": {"train_files": "/etc/shadow", "val_files": "/home/bob/private.parquet"},
    "custom_reward_function": {"path": "/tmp/evil.py", "name": "compute_score"},
    "actor_rollout_ref": {"model": {"path": "/srv/models/secret", "external_lib": "os"}},
    "trainer": {"default_local_dir": "/var/lib/posttrain", "resume_mode": "resume_path"},
}


@pytest.fixture
def external_run(owner):
    run, _ = external_run_create(
        owner=owner,
        key="x" * 16,
        name="qwen-grpo",
        source="verl",
        location="gpu-07",
        config=HOSTILE_CONFIG,
    )
    return run


def refused(response, status=409):
    assert response.status_code == status, response.content
    return errors_of(response)


def test_no_service_queues_an_external_runs_config(external_run):
    with pytest.raises(ExternalRunRefused, match="cannot launch them: their config is data"):
        run_create(experiment=external_run.experiment)
    Run.objects.filter(pk=external_run.pk).update(status=RunStatus.FAILED)
    external_run.refresh_from_db()
    with pytest.raises(ExternalRunRefused, match="cannot resume them"):
        run_resume(run=external_run)
    assert Run.objects.count() == 1  # nothing was queued
    # The driver's claim takes queued runs only; an external run never is one.
    assert run_claim_for_start(run_id=external_run.pk) is None


def test_the_api_refuses_launch_resume_clone_and_sweep(api, external_run):
    experiment = external_run.experiment.pk
    launch = refused(api.post(f"/experiments/{experiment}/launch", {}))
    assert "qwen-grpo holds runs the studio did not launch" in launch[None]
    clone = refused(api.post(f"/experiments/{experiment}/clone", {}))
    assert "cannot clone them" in clone[None]
    Run.objects.filter(pk=external_run.pk).update(status=RunStatus.LOST)
    assert "cannot resume them" in refused(api.post(f"/runs/{external_run.pk}/resume", {}))[None]
    sweep = api.post(
        "/sweeps",
        {"experiment": experiment, "spec": {"algorithm.kl_ctrl.kl_coef": [0.1, 0.2]}},
    )
    assert "its config is data to show, not to run" in refused(sweep, 400)["experiment"]
    assert Run.objects.count() == 1


def test_the_pages_refuse_launch_clone_and_cancel_with_a_message(client_in, external_run):
    experiment = external_run.experiment
    response = client_in.post(f"/experiments/{experiment.pk}/launch/", follow=True)
    assert "cannot launch them" in response.content.decode()
    response = client_in.get(f"/experiments/{experiment.pk}/clone/", follow=True)
    assert "cannot clone them" in response.content.decode()
    response = client_in.get(f"/runs/{external_run.pk}/clone/", follow=True)
    assert "cannot clone them" in response.content.decode()
    response = client_in.post(f"/runs/{external_run.pk}/cancel/", follow=True)
    page = response.content.decode()
    assert "runs outside the studio (gpu-07)" in page and "--allow-cancel" in page
    assert not Run.objects.get(pk=external_run.pk).cancel_requested


def test_cancel_of_a_run_whose_client_opted_in_is_a_flag_the_client_reads(api, owner):
    run, _ = external_run_create(
        owner=owner, key="y" * 16, name="trl", source="trl", cancel_honoured=True
    )
    assert run_cancel(run=run).cancel_requested and run.status == RunStatus.RUNNING
    beat = api.post(f"/external-runs/{run.pk}/heartbeat").json()
    assert beat["cancel_requested"] and beat["status"] == "running"
    finished = api.post(f"/external-runs/{run.pk}/finish", {"status": "cancelled"})
    assert finished.json()["status"] == "cancelled"


def test_an_active_external_run_is_not_deleted_and_says_why(client_in, external_run):
    response = client_in.post(f"/runs/{external_run.pk}/delete/", follow=True)
    assert "still reports from where it runs" in response.content.decode()
    assert Run.objects.filter(pk=external_run.pk).exists()
