"""A run's status is true: a dead driver is lost at once, a silent one is flagged stalled."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from functools import partial
from pathlib import Path

import pytest
from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from tests.webapp.fixtures import make_experiment
from tests.webapp.outage import database_down
from tests.workers.test_tasks import _alive
from webapp.runs.driver_writes import (
    run_claim_for_start,
    run_heartbeat,
    run_set_driver,
    runs_mark_lost,
    runs_mark_stalled,
)
from webapp.runs.models import MetricPoint, Run, RunStatus, Sample, run_dir
from webapp.runs.services import run_create
from workers.driver import HeartbeatThread
from workers.tasks import mark_lost_runs, spawn_local_driver


@pytest.fixture
def processes():
    """Start processes; kill whichever still run afterwards."""
    started: list[subprocess.Popen] = []

    def start(*command: str) -> subprocess.Popen:
        started.append(subprocess.Popen(command, start_new_session=True))
        return started[-1]

    yield start
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def fake_driver(
    processes, run_id: int, code: str = "import time; time.sleep(120)"
) -> subprocess.Popen:
    """A process running ``code`` whose command line is a driver's (``... -m workers.driver
    <id>``), returned once it shows that command line (until the child execs, /proc shows the
    parent's)."""
    process = processes(sys.executable, "-c", code, "-m", "workers.driver", str(run_id))
    deadline = time.monotonic() + 30
    while b"workers.driver" not in Path(f"/proc/{process.pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline, "the fake driver never showed its command line"
        time.sleep(0.01)
    return process


def running(owner, *, driver: str = "", host: str = "", stale_s: float = 0) -> Run:
    run = run_create(experiment=make_experiment(owner))
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.RUNNING,
        started_at=timezone.now() - timedelta(seconds=stale_s),
        heartbeat_at=timezone.now() - timedelta(seconds=stale_s),
        driver=driver,
        driver_host=host,
    )
    return Run.objects.get(pk=run.pk)


@pytest.mark.django_db
def test_a_local_driver_that_exited_is_lost_at_once_with_its_last_words(owner, processes):
    run = running(owner, host=socket.gethostname())
    driver = fake_driver(processes, run.pk)
    Run.objects.filter(pk=run.pk).update(driver=f"pid:{driver.pid}")
    assert runs_mark_lost(timeout_s=45) == []  # alive, fresh heartbeat
    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    assert runs_mark_lost(timeout_s=45) == []  # alive: a stale beat may be a database outage
    run_dir(run.pk).mkdir(parents=True, exist_ok=True)
    (run_dir(run.pk) / "driver.log").write_text("x" * 5000 + "\nMemoryError: the last words\n")
    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now())
    driver.kill()
    driver.wait()
    assert runs_mark_lost(timeout_s=45) == [run.pk]  # dead: a fresh heartbeat does not matter
    run.refresh_from_db()
    assert run.status == RunStatus.LOST and run.finished_at is not None
    assert run.error.startswith(
        f"the driver process (pid {driver.pid}) exited without recording an end state"
    )
    assert run.error.endswith("MemoryError: the last words") and len(run.error) < 2300


@pytest.mark.django_db
def test_a_recycled_pid_is_not_the_driver(owner, processes):
    other = processes("sleep", "60")
    run = running(owner, driver=f"pid:{other.pid}", host=socket.gethostname())
    assert runs_mark_lost(timeout_s=45) == [run.pk]
    assert "exited without recording an end state" in Run.objects.get(pk=run.pk).error


@pytest.mark.django_db
def test_a_driver_on_another_host_is_lost_by_its_heartbeat(owner, processes):
    fresh = running(owner, driver="pid:1", host="another-host", stale_s=10)
    stale = running(owner, driver="ray:posttrain-run-9", stale_s=46)
    assert runs_mark_lost(timeout_s=45) == [stale.pk]
    assert Run.objects.get(pk=fresh.pk).status == RunStatus.RUNNING
    assert Run.objects.get(pk=stale.pk).error.startswith(
        "no heartbeat from the driver for over 45 s"
    )


@pytest.mark.django_db
def test_a_ray_job_that_ray_says_ended_is_lost_at_once_with_how_it_ended(owner):
    ended = running(owner, driver="ray:posttrain-run-1")
    going = running(owner, driver="ray:posttrain-run-2")
    silent = running(owner, driver="ray:posttrain-run-3", stale_s=46)
    local = running(owner, driver="pid:1", host="another-host")
    asked: list[str] = []

    def job_end(job_id: str) -> str | None:  # what the job server says (workers.tasks asks it)
        asked.append(job_id)
        return "Ray says FAILED (exit code 1)" if job_id == "posttrain-run-1" else None

    assert sorted(runs_mark_lost(timeout_s=45, ray_job_end=job_end)) == [ended.pk, silent.pk]
    assert sorted(asked) == ["posttrain-run-1", "posttrain-run-2", "posttrain-run-3"]
    assert Run.objects.get(pk=ended.pk).error == (
        "the driver's Ray Job posttrain-run-1 ended without recording an end state: "
        "Ray says FAILED (exit code 1)\nresume the run to continue from its last checkpoint"
    )
    assert Run.objects.get(pk=going.pk).status == RunStatus.RUNNING  # running, fresh heartbeat
    # a job Ray says nothing of is left to its heartbeat, as before
    assert Run.objects.get(pk=silent.pk).error.startswith("no heartbeat from the driver")
    assert Run.objects.get(pk=local.pk).status == RunStatus.RUNNING


# A driver that no longer heeds anything: SIGTERM ignored, a child of its own in its session.
HUNG_DRIVER = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen(["sleep", "120"])
open(sys.argv[-1] + ".child", "w").write(str(child.pid))
time.sleep(120)
"""


@pytest.mark.django_db
def test_a_driver_that_does_not_heed_a_cancel_for_its_stall_time_is_stopped(
    owner, processes, tmp_path, monkeypatch
):
    from webapp.runs.driver_writes import runs_stop_unheeded_cancels
    from webapp.runs.services import run_cancel
    from workers.ray_jobs import RayJobServer
    from workers.tasks import stop_driver

    run = running(owner, host=socket.gethostname())
    monkeypatch.chdir(tmp_path)  # the driver writes its child's pid beside it, as <run id>.child
    driver = fake_driver(processes, run.pk, HUNG_DRIVER)
    Run.objects.filter(pk=run.pk).update(driver=f"pid:{driver.pid}")
    elsewhere = running(owner, driver="pid:1", host="another-host")
    for each in (run, elsewhere):
        run_cancel(run=Run.objects.get(pk=each.pk))
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.cancel_requested_at is not None
    deadline = time.monotonic() + 30
    while not (tmp_path / f"{run.pk}.child").exists():
        assert time.monotonic() < deadline, "the fake driver never started its child"
        time.sleep(0.05)
    child = int((tmp_path / f"{run.pk}.child").read_text())
    asked = run.cancel_requested_at

    stop = partial(stop_driver, jobs=RayJobServer(""))  # no Ray here

    def sweep(after_s: float) -> list[int]:
        return runs_stop_unheeded_cancels(
            stall_after=600, stop_driver=stop, now=asked + timedelta(seconds=after_s)
        )

    assert sweep(599) == []  # within its limit: it may be finishing a long step
    assert driver.poll() is None
    assert sweep(601) == [run.pk]  # the one on another host cannot be stopped from here
    assert driver.wait(timeout=10) == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while _alive(child):  # its session went with it
        assert time.monotonic() < deadline, "the driver's child outlived it"
        time.sleep(0.05)
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.finished_at is not None
    assert run.error == (
        "cancelled: the driver had not stopped 601 s after the cancel (its limit is 600 s), so "
        f"the studio stopped it (SIGKILL to its process group {driver.pid}); the step it was in "
        "is lost, the steps and checkpoints before it are kept"
    )
    assert Run.objects.get(pk=elsewhere.pk).status == RunStatus.RUNNING


# A driver hung in a step on another host: only its heartbeat thread runs, SIGTERM is ignored,
# and it has a child in its session.
HUNG_BEATING_DRIVER = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
from workers.driver import HeartbeatThread, setup_studio_process
setup_studio_process()
child = subprocess.Popen(["sleep", "120"])
open(sys.argv[-1] + ".child", "w").write(str(child.pid))
HeartbeatThread(int(sys.argv[-1]), 0.1, stall_after=2.0).start()
time.sleep(120)
"""


@pytest.mark.django_db(transaction=True)
def test_a_driver_the_sweep_cannot_reach_stops_itself_on_a_cancel_it_does_not_heed(owner, tmp_path):
    from webapp.runs.services import run_cancel
    from workers.tasks import driver_env

    run = running(owner, host="another-host", stale_s=60)
    env = {**driver_env(), "PYTHONPATH": str(settings.BASE_DIR)}
    command = [sys.executable, "-c", HUNG_BEATING_DRIVER, "-m", "workers.driver", str(run.pk)]
    driver = subprocess.Popen(command, cwd=tmp_path, env=env, start_new_session=True)
    try:
        Run.objects.filter(pk=run.pk).update(driver=f"pid:{driver.pid}")
        deadline = time.monotonic() + 60
        while not (tmp_path / f"{run.pk}.child").exists():
            assert driver.poll() is None, "the fake driver exited"
            assert time.monotonic() < deadline, "the fake driver never started its child"
            time.sleep(0.05)
        child = int((tmp_path / f"{run.pk}.child").read_text())
        while (timezone.now() - Run.objects.get(pk=run.pk).heartbeat_at).total_seconds() > 30:
            assert time.monotonic() < deadline, "the heartbeat thread never beat"
            time.sleep(0.05)
        time.sleep(0.5)
        assert driver.poll() is None  # beating, no cancel: it goes on
        run_cancel(run=Run.objects.get(pk=run.pk))
        asked = time.monotonic()
        assert driver.wait(timeout=30) == -signal.SIGKILL
        assert time.monotonic() - asked > 1.5  # not before its limit of 2 s
        deadline = time.monotonic() + 10
        while _alive(child):  # its session went with it
            assert time.monotonic() < deadline, "the driver's child outlived it"
            time.sleep(0.05)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(timeout=30)
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.finished_at is not None
    assert run.error.startswith("cancelled: the driver had not stopped ")
    assert run.error.endswith(
        "(its limit is 2 s), so it stopped itself (SIGKILL to its process group); the step it "
        "was in is lost, the steps and checkpoints before it are kept"
    )


@pytest.mark.django_db
def test_the_sweep_defaults_to_a_45_s_heartbeat_and_records_the_driver_host(owner, settings):
    assert settings.POSTTRAIN_HEARTBEAT_TIMEOUT_S == 45
    assert settings.CELERY_BEAT_SCHEDULE["mark-lost-runs"]["schedule"] <= 15
    run = running(owner, stale_s=46)
    run_set_driver(run_id=run.pk, driver="pid:4242")
    run.refresh_from_db()
    assert run.driver_host == socket.gethostname()
    run_set_driver(run_id=run.pk, driver="ray:posttrain-run-1")
    assert Run.objects.get(pk=run.pk).driver_host == ""
    assert mark_lost_runs() == [run.pk]


def points(run: Run, *ages_s: float) -> None:
    now = timezone.now()
    for step, age in enumerate(ages_s, start=1):
        MetricPoint.objects.create(
            run=run, step=step, wall_time=now - timedelta(seconds=age), metrics={}
        )


@pytest.mark.django_db
def test_a_run_with_no_new_step_for_the_set_time_is_flagged_stalled_then_cleared(owner):
    run = running(owner, stale_s=100)
    points(run, 30, 20)
    assert runs_mark_stalled(stall_after=60) == []
    assert runs_mark_stalled(stall_after=15) == [run.pk]
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING  # not an end state: it can still be cancelled
    assert abs((timezone.now() - run.stalled_since).total_seconds() - 20) < 5
    assert runs_mark_stalled(stall_after=15) == []  # flagged once
    run_heartbeat(run_id=run.pk, step=3)  # a new step lands
    assert Run.objects.get(pk=run.pk).stalled_since is None
    Run.objects.filter(pk=run.pk).update(stalled_since=timezone.now() - timedelta(seconds=20))
    MetricPoint.objects.create(run=run, step=3, wall_time=timezone.now(), metrics={})
    assert runs_mark_stalled(stall_after=15) == []
    assert Run.objects.get(pk=run.pk).stalled_since is None  # the sweep saw the progress too


@pytest.mark.django_db
def test_the_default_stall_time_is_ten_median_steps_and_at_least_600_s(owner):
    quick = running(owner, stale_s=3600)
    points(quick, 703, 702, 701)  # 1 s steps: 600 s floor, and 701 s passed
    slow = running(owner, stale_s=3600)
    points(slow, 900, 800, 700)  # 100 s steps: 1000 s allowed, 700 s passed
    assert runs_mark_stalled(stall_after=None) == [quick.pk]
    fresh = running(owner, stale_s=599)  # no step yet: counted from its start
    assert runs_mark_stalled(stall_after=None) == []
    assert Run.objects.get(pk=fresh.pk).stalled_since is None


@pytest.mark.django_db
def test_the_run_page_says_it_is_stalled(client, owner):
    client.force_login(owner)
    run = running(owner)
    Run.objects.filter(pk=run.pk).update(stalled_since=timezone.now() - timedelta(minutes=12))
    page = client.get(reverse("runs:detail", args=[run.pk])).content.decode()
    assert "stalled: no new step for 12" in page


@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_thread_keeps_beating_through_an_outage(owner, caplog):
    run = running(owner, stale_s=3600)
    heartbeat = HeartbeatThread(run.pk, 0.05)
    with database_down():
        heartbeat.start()
        time.sleep(0.4)
        assert heartbeat.is_alive()
    assert caplog.text.count(f"heartbeat of run {run.pk} failed") == 1  # once per outage
    time.sleep(0.4)
    heartbeat.stop()
    heartbeat.join(5)
    beat = Run.objects.get(pk=run.pk).heartbeat_at
    assert (timezone.now() - beat).total_seconds() < 2


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_sigkilled_driver_is_lost_at_the_next_sweep_and_leaves_no_half_step(
    owner, monkeypatch, capsys
):
    from engine.env import data_dir
    from engine.tiny import ensure_tiny_assets

    shared = data_dir()
    ensure_tiny_assets(shared)
    data = Path(settings.POSTTRAIN_DATA_DIR)
    data.mkdir(parents=True, exist_ok=True)
    (data / "tiny").symlink_to(shared / "tiny", target_is_directory=True)
    monkeypatch.setattr("webapp.runs.services._dispatch_start", lambda run_id: None)
    run = run_create(
        experiment=make_experiment(
            owner,
            data__train_batch_size=8,
            actor_rollout_ref__actor__ppo_mini_batch_size=8,
            actor_rollout_ref__rollout__n=4,
            trainer__total_training_steps=500,
            trainer__val_before_train=False,
            trainer__test_freq=-1,
        )
    )
    run_claim_for_start(run_id=run.pk)
    driver = spawn_local_driver(run.pk)
    run_set_driver(run_id=run.pk, driver=driver)
    pid = int(driver[4:])
    deadline = time.monotonic() + 300
    while Run.objects.get(pk=run.pk).latest_step < 5:
        assert time.monotonic() < deadline, (run_dir(run.pk) / "driver.log").read_text()
        time.sleep(0.1)
    os.killpg(pid, signal.SIGKILL)
    killed = time.monotonic()
    while mark_lost_runs() != [run.pk]:
        assert time.monotonic() < killed + 10, "the dead driver was not marked lost"
        time.sleep(0.2)
    took = time.monotonic() - killed
    with capsys.disabled():
        print(f"\nSIGKILLed driver lost {took:.1f} s after the kill, at the first sweep")
    run.refresh_from_db()
    assert run.status == RunStatus.LOST
    assert f"the driver process (pid {pid}) exited" in run.error
    metric_steps = set(MetricPoint.objects.filter(run=run).values_list("step", flat=True))
    sample_steps = set(Sample.objects.filter(run=run).values_list("step", flat=True))
    assert sample_steps == metric_steps and len(metric_steps) >= 5
