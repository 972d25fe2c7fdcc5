"""A database outage never ends a run: the recorder keeps whole steps and writes each once.

In-process tests take the connection away (``tests.webapp.outage``); the fault tests run the real
driver against a PostgreSQL cluster of their own on port 5439 (the shared one on 5432 is never
touched), stop that cluster mid-run with ``pg_ctlcluster ... stop -m fast`` and start it again.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.conf import settings

from tests.webapp.fixtures import make_experiment
from tests.webapp.outage import database_down
from tests.workers.test_database_recorder import sample
from webapp.runs.driver_writes import run_claim_for_start, run_mark_running, run_record_step
from webapp.runs.models import MetricPoint, Run, RunStatus, Sample
from webapp.runs.services import run_create
from workers.database_recorder import SPILL_FILE, RecordingGaveUp, RunRecorder


@pytest.fixture
def running_run(owner):
    run = run_create(experiment=make_experiment(owner))
    run_claim_for_start(run_id=run.pk)
    return run_mark_running(run_id=run.pk)


def batch(step: int, size: int = 8) -> list:
    return [sample(step, i // 4, i % 4) for i in range(size)]


@pytest.mark.django_db(transaction=True)
def test_steps_taken_while_the_database_is_down_are_written_once_when_it_returns(
    running_run, tmp_path
):
    # Room for two steps' samples in memory: the rest spill to the run folder.
    recorder = RunRecorder(running_run.pk, spill_dir=tmp_path, memory_rows=16)
    recorder.on_start(config={}, total_steps=6, start_step=0)
    with database_down():
        for step in range(1, 6):
            recorder.on_samples(step, batch(step))
            recorder.on_step(step, {"critic/score/mean": step / 10})
            assert recorder.should_stop() is False  # unknown during an outage: not cancelled
            recorder.retry_at = 0.0  # try at every step, as if the back-off had passed
        assert len(recorder.pending) == 5
        assert len((tmp_path / SPILL_FILE).read_text().splitlines()) == 3
    recorder.retry_at = 0.0
    recorder.on_samples(6, batch(6))
    recorder.on_step(6, {"critic/score/mean": 0.6})
    assert len(recorder.pending) == 0 and not (tmp_path / SPILL_FILE).exists()
    points = MetricPoint.objects.filter(run=running_run).order_by("step")
    assert [(p.step, p.metrics["critic/score/mean"]) for p in points] == [
        (s, s / 10) for s in range(1, 7)
    ]
    counts = {s: Sample.objects.filter(run=running_run, step=s).count() for s in range(1, 7)}
    assert counts == dict.fromkeys(range(1, 7), 8)
    assert Run.objects.get(pk=running_run.pk).latest_step == 6
    recorder.on_finish(status="succeeded")
    assert Run.objects.get(pk=running_run.pk).status == RunStatus.SUCCEEDED


@pytest.mark.django_db
def test_writing_a_step_again_replaces_it_instead_of_doubling_it(running_run):
    for _ in range(2):  # a retry after a write that landed but whose answer was lost
        run_record_step(
            run_id=running_run.pk, step=3, samples=batch(3), metrics={"critic/score/mean": 1.0}
        )
    assert Sample.objects.filter(run=running_run, step=3).count() == 8
    assert MetricPoint.objects.filter(run=running_run, step=3).count() == 1


@pytest.mark.django_db
def test_a_step_lands_whole_or_not_at_all(running_run, monkeypatch):
    def broken(**kwargs):
        raise RuntimeError("killed between the samples and the metrics")

    monkeypatch.setattr("webapp.runs.driver_writes.metric_point_upsert", broken)
    with pytest.raises(RuntimeError, match="between the samples and the metrics"):
        run_record_step(run_id=running_run.pk, step=1, samples=batch(1), metrics={"x": 1.0})
    assert not Sample.objects.filter(run=running_run).exists()


@pytest.mark.django_db(transaction=True)
def test_the_end_state_is_retried_then_given_up_with_the_reason(running_run, tmp_path):
    recorder = RunRecorder(running_run.pk, spill_dir=tmp_path, finish_timeout_s=1.0)
    recorder.on_step(1, {"critic/score/mean": 0.5})
    with database_down(), pytest.raises(RecordingGaveUp) as caught:
        recorder.on_finish(status="succeeded")
    message = str(caught.value)
    assert "its end state (succeeded) could not be written" in message
    assert "1 s finish timeout" in message and "OperationalError" in message
    assert Run.objects.get(pk=running_run.pk).status == RunStatus.RUNNING


# -- the real driver against a cluster that is stopped and started -------------------------------

CLUSTER, PORT = "faults", 5439
STEPS = 90
SMALL = {
    "data__train_batch_size": 8,
    "actor_rollout_ref__actor__ppo_mini_batch_size": 8,
    "actor_rollout_ref__rollout__n": 4,
    "trainer__save_freq": -1,
    "trainer__test_freq": -1,
    "trainer__val_before_train": False,
}
SAMPLES_PER_STEP = 8 * 4

CREATE_RUN = """
import json, sys
from django.contrib.auth import get_user_model
import webapp.runs.services as services
from tests.webapp.fixtures import make_experiment
from webapp.runs.driver_writes import run_claim_for_start

services._dispatch_start = lambda run_id: None  # the test starts the driver itself
user, _ = get_user_model().objects.get_or_create(username="faults")
values = json.loads(sys.stdin.read())
experiment = make_experiment(user, name=values.pop("name"), **values)
run = services.run_create(experiment=experiment)
run_claim_for_start(run_id=run.pk)
print("RUN", run.pk)
"""


def _pg(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, check=True, timeout=120)


@pytest.fixture(scope="session")
def faults_cluster() -> Iterator[str]:
    """Create, start and migrate a PostgreSQL cluster of its own; drop it at the end."""
    if shutil.which("pg_createcluster") is None:
        pytest.skip(
            "pg_createcluster (Debian's postgresql-common) is not installed: the outage tests "
            "need a PostgreSQL cluster of their own to stop and start"
        )
    version = _pg("pg_lsclusters", "-h").stdout.split()[0]
    if re.search(rf"^{version}\s+{CLUSTER}\s", _pg("pg_lsclusters", "-h").stdout, re.M):
        _pg("pg_dropcluster", "--stop", version, CLUSTER)  # left by an interrupted session
    _pg("pg_createcluster", version, CLUSTER, "--port", str(PORT), "--", "--auth=trust")
    try:
        _pg("pg_ctlcluster", version, CLUSTER, "start")
        _pg("psql", "-h", "127.0.0.1", "-p", str(PORT), "-U", "postgres", "-c",
            "CREATE DATABASE posttrain_faults")  # fmt: skip
        url = f"postgresql://postgres@127.0.0.1:{PORT}/posttrain_faults"
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "-v", "0"],
            cwd=settings.BASE_DIR,
            env={**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "webapp.settings"},
            check=True,
            timeout=300,
        )
        yield url
    finally:
        _pg("pg_dropcluster", "--stop", version, CLUSTER)


class FaultyRun:
    """A tiny run trained by the real driver process on the faults cluster."""

    def __init__(self, url: str, data: Path, log: Path) -> None:
        import psycopg

        self.url, self.data, self.log = url, data, log
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "webapp.settings",
            "DATABASE_URL": url,
            "POSTTRAIN_DATA_DIR": str(data),
            "POSTTRAIN_REWARD_MODULES_DIR": str(settings.POSTTRAIN_REWARD_MODULES_DIR),
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        values = {"name": f"outage {time.time_ns()}", **SMALL}
        values["trainer__total_training_steps"] = STEPS
        created = subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", CREATE_RUN],
            input=json.dumps(values),
            cwd=settings.BASE_DIR,
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        self.run_id = int(re.search(r"^RUN (\d+)$", created.stdout, re.M).group(1))
        self.psycopg = psycopg
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "workers.driver", str(self.run_id)],
                cwd=settings.BASE_DIR,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def query(self, sql: str) -> list[tuple]:
        with self.psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            return conn.execute(sql, {"run": self.run_id}).fetchall()

    def latest_step(self) -> int:
        return self.query("SELECT latest_step FROM runs_run WHERE id = %(run)s")[0][0]

    def wait_for_step(self, step: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.latest_step() < step:
            assert self.process.poll() is None, self.log.read_text()[-4000:]
            assert time.monotonic() < deadline, f"no step {step}:\n{self.log.read_text()[-4000:]}"
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


@pytest.fixture
def faulty_run(faults_cluster, studio_dirs) -> Iterator[FaultyRun]:
    from engine.env import data_dir
    from engine.tiny import ensure_tiny_assets

    shared = data_dir()
    ensure_tiny_assets(shared)
    data = studio_dirs / "faults-data"
    data.mkdir()
    (data / "tiny").symlink_to(shared / "tiny", target_is_directory=True)
    run = FaultyRun(faults_cluster, data, studio_dirs / "driver.log")
    yield run
    run.stop()


def cluster(action: str) -> None:
    version = _pg("pg_lsclusters", "-h").stdout.split()[0]
    extra = ["-m", "fast"] if action == "stop" else []
    _pg("pg_ctlcluster", version, CLUSTER, action, *extra)


def outage_mid_run(run: FaultyRun, outage_s: float) -> dict:
    """Stop the cluster at about a third of the run for ``outage_s``; return what was measured."""
    run.start()
    run.wait_for_step(STEPS // 3, timeout=600)
    cluster("stop")
    down_at = datetime.now(UTC)
    time.sleep(outage_s)
    cluster("start")
    up_at = datetime.now(UTC)
    assert run.process.wait(timeout=600 + outage_s) == 0, run.log.read_text()[-4000:]
    status, error = run.query("SELECT status, error FROM runs_run WHERE id = %(run)s")[0]
    steps = run.query(
        "SELECT step, wall_time FROM runs_metricpoint WHERE run_id = %(run)s ORDER BY step"
    )
    samples = {
        step: (rows, keys)
        for step, rows, keys in run.query(
            "SELECT step, count(*), count(DISTINCT (split, prompt_index, sample_index)) "
            "FROM runs_sample WHERE run_id = %(run)s GROUP BY step"
        )
    }
    trained_while_down = [s for s, wall in steps if down_at < wall < up_at]
    return {
        "status": status,
        "error": error,
        "steps": [s for s, _ in steps],
        "samples": samples,
        "trained_while_down": trained_while_down,
        "log": run.log.read_text(),
    }


def assert_nothing_lost(measured: dict) -> None:
    assert measured["status"] == RunStatus.SUCCEEDED, measured["error"]
    assert measured["steps"] == list(range(1, STEPS + 1))  # each step once, none missing
    # 32 rows and 32 distinct keys at every step: complete, none doubled.
    expected = (SAMPLES_PER_STEP, SAMPLES_PER_STEP)
    assert measured["samples"] == dict.fromkeys(range(1, STEPS + 1), expected)
    assert measured["trained_while_down"], "no step was trained during the outage"
    assert "the database is unreachable" in measured["log"]
    assert "the database answers again" in measured["log"]


def test_a_10_s_outage_mid_run_loses_no_step_and_the_run_succeeds(faulty_run):
    measured = outage_mid_run(faulty_run, 10)
    print(f"10 s outage: {len(measured['steps'])}/{STEPS} steps, {measured['status']}, "
          f"{len(measured['trained_while_down'])} trained while down")  # fmt: skip
    assert_nothing_lost(measured)


@pytest.mark.slow
def test_a_120_s_outage_mid_run_loses_no_step_and_the_run_succeeds(faulty_run):
    measured = outage_mid_run(faulty_run, 120)
    print(f"120 s outage: {len(measured['steps'])}/{STEPS} steps, {measured['status']}, "
          f"{len(measured['trained_while_down'])} trained while down")  # fmt: skip
    assert_nothing_lost(measured)
