"""Driver slots: queued runs wait their turn and start oldest first; a lost start message is healed."""

from __future__ import annotations

import time

import pytest
from django.test import override_settings

from tests.webapp.fixtures import builder_data, make_experiment, tiny_config
from tests.workers.test_lifecycle import SMALL, start_worker, tiny_cache, wait_for  # noqa: F401
from webapp.runs.models import Run, RunStatus
from webapp.runs.services import run_create
from workers.tasks import dispatch_queued_runs, start_run


def queued_run(owner, experiment=None, **fields) -> Run:
    """Return a queued run row whose start message was never sent (as if the broker lost it)."""
    experiment = experiment or make_experiment(owner)
    number = Run.objects.filter(experiment=experiment).count() + 1
    fields.setdefault("config", {})
    return Run.objects.create(experiment=experiment, owner=owner, number=number, **fields)


@pytest.mark.django_db
@override_settings(POSTTRAIN_MAX_RUNNING_RUNS=1)
def test_a_run_waits_queued_while_every_driver_slot_is_taken(owner):
    busy = queued_run(owner, status=RunStatus.RUNNING)
    waiting = queued_run(owner, experiment=busy.experiment)
    assert start_run(waiting.pk) == "skipped"
    waiting.refresh_from_db()
    assert waiting.status == RunStatus.QUEUED and waiting.driver == ""
    # With the slot still taken the sweep starts nothing either.
    assert dispatch_queued_runs() == []
    assert Run.objects.get(pk=waiting.pk).status == RunStatus.QUEUED


@pytest.mark.django_db(transaction=True)  # the drivers read the rows from their own connection
@override_settings(POSTTRAIN_MAX_RUNNING_RUNS=1)
def test_the_sweep_starts_a_run_whose_message_was_lost_and_only_the_oldest_when_one_slot_frees(
    owner,
):
    # Configs the driver refuses at once, so the started drivers end within seconds.
    first = run_create(experiment=make_experiment(owner))
    config = dict(first.config)
    config["trainer"] = {**config["trainer"], "bogus_key": 1}
    Run.objects.filter(pk=first.pk).update(config=config)
    second = queued_run(owner, experiment=first.experiment, config=config)
    assert dispatch_queued_runs() == [first.pk]
    assert Run.objects.get(pk=second.pk).status == RunStatus.QUEUED
    deadline = time.monotonic() + 60
    while Run.objects.get(pk=first.pk).status != RunStatus.FAILED:
        assert time.monotonic() < deadline, "the first driver did not end"
        time.sleep(0.2)
    assert dispatch_queued_runs() == [second.pk]
    assert Run.objects.get(pk=second.pk).driver.startswith("pid:")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_three_runs_queued_on_one_worker_run_one_after_another(client, owner, start_worker):  # noqa: F811
    client.force_login(owner)
    config = tiny_config(**SMALL, trainer__total_training_steps=2, trainer__test_freq=-1)
    for name in ("first", "second", "third"):
        data = builder_data(config, owner, name=name, trainer__val_before_train=None)
        assert client.post("/experiments/new/", data).status_code == 302
    runs = list(Run.objects.order_by("created_at"))
    assert [r.status for r in runs] == [RunStatus.QUEUED] * 3
    start_worker()
    deadline = time.monotonic() + 600
    # The beat's part: ask the worker to sweep, as the schedule does every few seconds.
    while any(r.status != RunStatus.SUCCEEDED for r in runs):
        assert time.monotonic() < deadline, [r.status for r in runs]
        dispatch_queued_runs.delay()
        time.sleep(2)
        for run in runs:
            run.refresh_from_db()
            if run.status not in (RunStatus.QUEUED, RunStatus.STARTING, RunStatus.RUNNING):
                wait_for(run, lambda r: r.status == RunStatus.SUCCEEDED, 1, "succeed")
    for earlier, later in zip(runs, runs[1:], strict=False):
        assert earlier.finished_at <= later.started_at, "two runs had a driver at once"
