"""Celery tasks called directly, and the local driver process started for real."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from engine.env import CPU_PROCESS_ENV
from tests.webapp.fixtures import make_experiment
from webapp.runs.models import Run, RunStatus
from webapp.runs.services import run_cancel, run_create
from workers.tasks import (
    database_url,
    driver_env,
    driver_settings_env,
    mark_lost_runs,
    start_run,
)


@pytest.mark.django_db
def test_the_driver_gets_the_database_of_this_process_and_single_threaded_torch(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    env = driver_env()
    assert env["DATABASE_URL"] == database_url()
    assert database_url().endswith("/" + connection.settings_dict["NAME"])
    assert connection.settings_dict["NAME"].startswith("test_")
    assert env["RAY_AUTH_MODE"] == "disabled"
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "1"
    assert env["DJANGO_SETTINGS_MODULE"] == "webapp.settings"


@pytest.mark.django_db
def test_a_thread_count_set_for_the_worker_carries_over_to_the_driver(monkeypatch):
    # Counts this test process does not run with, so only a carried-over value can match.
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("MKL_NUM_THREADS", "5")
    env = driver_env()
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"]) == ("3", "5")


@pytest.mark.django_db
def test_the_driver_gets_only_the_allowed_variables_and_its_own_secret_key(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "worker-only-aws-secret")
    monkeypatch.setenv("GITHUB_TOKEN", "worker-only-token")
    monkeypatch.setenv("DJANGO_SECRET_KEY", "the-web-apps-secret-" * 3)
    monkeypatch.setenv("POSTTRAIN_REWARD_MODULES_DIR", "/srv/rewards")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    env = driver_env()
    assert "AWS_SECRET_ACCESS_KEY" not in env and "GITHUB_TOKEN" not in env
    assert not {"worker-only-aws-secret", "worker-only-token"} & set(env.values())
    assert env["DJANGO_SECRET_KEY"] != os.environ["DJANGO_SECRET_KEY"]
    assert len(env["DJANGO_SECRET_KEY"]) >= 50  # a fresh one per driver
    assert driver_env()["DJANGO_SECRET_KEY"] != env["DJANGO_SECRET_KEY"]
    assert env["POSTTRAIN_REWARD_MODULES_DIR"] == "/srv/rewards"
    assert (env["CUDA_VISIBLE_DEVICES"], env["LC_ALL"]) == ("1", "C.UTF-8")
    assert env["PATH"] == os.environ["PATH"]
    # A Ray Job starts from its node's environment: it gets the settings variables only.
    settings_names = {"DJANGO_SETTINGS_MODULE", "DJANGO_SECRET_KEY", "DATABASE_URL", "REDIS_URL"}
    posttrain_names = {
        "POSTTRAIN_DATA_DIR",
        "POSTTRAIN_HEARTBEAT_TIMEOUT_S",
        "POSTTRAIN_TOOL_MODULES_DIR",
    }
    assert set(driver_settings_env()) == {*CPU_PROCESS_ENV, *settings_names, *posttrain_names}
    # ... and the reward services the studio checked its config against, where listed.
    monkeypatch.setenv("POSTTRAIN_REWARD_ENDPOINTS", "judge=http://10.0.0.5:8000/score")
    listed = driver_settings_env()["POSTTRAIN_REWARD_ENDPOINTS"]
    assert listed == "judge=http://10.0.0.5:8000/score"


def test_a_driver_imports_tools_only_from_the_studios_installed_modules_folder(
    monkeypatch, settings, tmp_path
):
    settings.POSTTRAIN_REWARD_MODULES_DIR = tmp_path / "installed"
    monkeypatch.setenv("POSTTRAIN_TOOL_MODULES_DIR", "/home/someone/tools")  # the worker's own
    assert driver_env()["POSTTRAIN_TOOL_MODULES_DIR"] == str(tmp_path / "installed")


def test_a_ray_driver_links_its_alerts_to_the_studios_public_address(settings):
    settings.POSTTRAIN_PUBLIC_URL = "https://studio.example.org"
    assert driver_settings_env()["POSTTRAIN_PUBLIC_URL"] == "https://studio.example.org"


def test_a_ray_driver_stops_itself_on_an_unheeded_cancel_by_the_studios_limit(settings):
    settings.POSTTRAIN_STALL_AFTER_S = 900.0
    assert driver_settings_env()["POSTTRAIN_STALL_AFTER_S"] == "900.0"


@pytest.mark.django_db
def test_start_run_does_nothing_for_a_run_that_is_not_queued(owner):
    run = run_cancel(run=run_create(experiment=make_experiment(owner)))
    assert start_run(run.pk) == "skipped"
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.driver == ""
    assert start_run(run.pk + 1000) == "skipped"


@pytest.mark.django_db
def test_mark_lost_runs_uses_the_heartbeat_timeout_setting(owner, settings):
    settings.POSTTRAIN_HEARTBEAT_TIMEOUT_S = 60
    run = run_create(experiment=make_experiment(owner))
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.RUNNING, heartbeat_at=timezone.now() - timedelta(seconds=61)
    )
    assert mark_lost_runs() == [run.pk]
    assert Run.objects.get(pk=run.pk).status == RunStatus.LOST


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return (
        Path(f"/proc/{pid}").exists()
        and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]
    )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_start_run_launches_a_detached_driver_once(owner, settings):
    run = run_create(experiment=make_experiment(owner))
    config = dict(run.config)
    config["trainer"] = {**config["trainer"], "bogus_key": 1}
    Run.objects.filter(pk=run.pk).update(config=config)
    driver = start_run(run.pk)
    assert driver.startswith("pid:")
    assert start_run(run.pk) == "skipped"
    pid = int(driver.split(":")[1])
    assert os.getsid(pid) == pid  # its own session: it outlives a worker restart
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and Run.objects.get(pk=run.pk).status != RunStatus.FAILED:
        time.sleep(0.2)
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED, run.error
    assert run.driver == driver
    assert "trainer.bogus_key" in run.error
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    log = Path(settings.POSTTRAIN_DATA_DIR) / "runs" / str(run.pk) / "driver.log"
    assert f"run {run.pk}: failed" in log.read_text()
