"""A studio run that names a tracker logs to it, inside the run's own folder on the server.

Nothing lands in the worker's HOME: the run's trackers have a home in the run's folder.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.webapp.fixtures import make_experiment
from tests.workers.test_lifecycle import SMALL, tiny_cache  # noqa: F401
from webapp.runs.driver_writes import run_claim_for_start
from webapp.runs.models import MetricPoint, Run, RunStatus, run_dir
from webapp.runs.services import run_create
from workers.driver import drive
from workers.tasks import driver_env


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_studio_run_logs_to_tensorboard_in_its_own_folder(
    owner,
    tiny_cache,  # noqa: F811
    monkeypatch,
    tmp_path,
):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # Where the worker's environment would send tensorboard: the driver must not write there.
    elsewhere = tmp_path / "elsewhere"
    monkeypatch.setenv("TENSORBOARD_DIR", str(elsewhere))
    experiment = make_experiment(
        owner,
        **SMALL,
        trainer__logger=["console", "tensorboard"],
        trainer__total_training_steps=2,
        trainer__test_freq=-1,
        trainer__val_before_train=False,
    )
    run = run_create(experiment=experiment)
    run_claim_for_start(run_id=run.pk)
    assert drive(run.pk, publish=False) == "succeeded"
    assert Run.objects.get(pk=run.pk).status == RunStatus.SUCCEEDED
    folder = run_dir(run.pk) / "trackers" / "tensorboard"
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    recorded = {p.step: p.metrics for p in MetricPoint.objects.filter(run_id=run.pk)}
    assert sorted(recorded) == [1, 2]
    assert set(events.Tags()["scalars"]) == set(recorded[1]) | set(recorded[2])
    for key, value in recorded[2].items():
        (point,) = [e for e in events.Scalars(key) if e.step == 2]
        assert point.value == pytest.approx(value, rel=1e-6, abs=1e-6)
    assert not elsewhere.exists()
    assert os.environ["TENSORBOARD_DIR"] == str(elsewhere)  # restored after the run


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_studio_run_with_trackers_leaves_nothing_in_the_workers_home(
    owner,
    tiny_cache,  # noqa: F811
    monkeypatch,
    settings,
    tmp_path,
):
    from engine.tools.tiny_uris import resolve_tiny_uri

    model = Path(resolve_tiny_uri("tiny://model", tiny_cache))
    home = tmp_path / "worker-home"  # the worker's HOME, as the web app's check sees it
    home.mkdir()
    (home / "models").symlink_to(model.parent, target_is_directory=True)  # a model root
    monkeypatch.setenv("HOME", str(home))
    for name in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    settings.POSTTRAIN_MODEL_ROOTS = "~/models"
    experiment = make_experiment(
        owner,
        **SMALL,
        actor_rollout_ref__model__path=f"~/models/{model.name}",  # the worker's home, as checked
        trainer__logger=["console", "tensorboard", "mlflow", "wandb"],
        trainer__total_training_steps=1,
        trainer__test_freq=-1,
        trainer__val_before_train=False,
    )
    run = run_create(experiment=experiment)
    run_claim_for_start(run_id=run.pk)
    assert drive(run.pk, publish=False) == "succeeded", Run.objects.get(pk=run.pk).error
    assert os.listdir(home) == ["models"]  # the model root it had, and nothing else
    # What the libraries keep in a home is in the run's folder instead.
    tracker_home = run_dir(run.pk) / "trackers" / "home"
    # (MLflow's home file is checked in a process of its own, in tests/engine/trainer/
    # test_trackers.py: it decides once per process, at its first use, whether it runs in CI.)
    assert (tracker_home / ".cache" / "wandb").is_dir()
    assert os.environ["HOME"] == str(home)  # restored after the run


@pytest.mark.django_db
def test_the_driver_gets_the_trackers_keys_and_hosts(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "server-wandb-key")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.internal:5000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "worker-only-aws-secret")
    env = driver_env()
    assert env["WANDB_API_KEY"] == "server-wandb-key"
    assert env["MLFLOW_TRACKING_URI"] == "http://mlflow.internal:5000"
    assert "AWS_SECRET_ACCESS_KEY" not in env
