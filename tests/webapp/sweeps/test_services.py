"""Sweep services: every member checked before anything is written, quotas, concurrency, cancel."""

from __future__ import annotations

import time
import uuid

import pytest
from django.test import override_settings

from tests.webapp.fixtures import make_experiment
from tests.workers.test_lifecycle import stop_driver
from webapp.experiments.models import Experiment
from webapp.runs.driver_writes import run_claim_for_start
from webapp.runs.models import DRIVER_STATUSES, Run, RunStatus
from webapp.runs.quotas import LaunchRefused
from webapp.runs.services import run_create
from webapp.sweeps import services as sweep_services
from webapp.sweeps.models import Sweep, SweepMember
from webapp.sweeps.services import (
    SweepAlreadyCreated,
    SweepInvalid,
    sweep_cancel,
    sweep_create,
)
from workers.celery_app import app
from workers.tasks import dispatch_queued_runs

LR = "actor_rollout_ref.actor.optim.lr"
N = "actor_rollout_ref.rollout.n"


def lr_sweep(experiment, concurrency=2, values=(1e-6, 3e-6, 1e-5), **kwargs):
    spec = {"mode": "grid", "params": {LR: list(values)}}
    return sweep_create(
        experiment=experiment, name="lr", spec=spec, concurrency=concurrency, **kwargs
    )


def member_runs(sweep) -> list[Run]:
    return [m.run for m in sweep.members.select_related("run").order_by("index")]


def nothing_created() -> bool:
    return not (Sweep.objects.exists() or SweepMember.objects.exists() or Run.objects.exists())


@pytest.mark.django_db
def test_each_member_is_a_run_of_the_experiment_with_its_values_in_its_config(owner):
    experiment = make_experiment(owner)
    sweep = lr_sweep(experiment)
    runs = member_runs(sweep)
    assert [r.experiment_id for r in runs] == [experiment.pk] * 3
    assert [r.number for r in runs] == [1, 2, 3]
    assert [r.config["actor_rollout_ref"]["actor"]["optim"]["lr"] for r in runs] == [
        1e-6,
        3e-6,
        1e-5,
    ]
    assert [m.values for m in sweep.members.order_by("index")] == [
        {LR: 1e-6},
        {LR: 3e-6},
        {LR: 1e-5},
    ]
    assert all(r.status == RunStatus.QUEUED for r in runs)
    assert sweep.spec == {"mode": "grid", "params": {LR: [1e-6, 3e-6, 1e-5]}}


@pytest.mark.django_db
def test_a_bad_value_names_its_key_and_member_and_nothing_is_created(owner):
    experiment = make_experiment(owner)
    with pytest.raises(SweepInvalid) as info:
        sweep_create(
            experiment=experiment,
            name="bad",
            spec={"mode": "grid", "params": {N: [4, 1], LR: ["fast", 1e-6]}},
            concurrency=1,
        )
    messages = [(e.key, e.message) for e in info.value.errors]
    # member 1 (n=4, lr='fast'): the value is refused by the schema; member 3 (n=1, lr='fast')
    # and member 4 (n=1, lr=1e-6): the validator's GRPO group rule.
    assert (LR, f"member 1 of 4 ({N}=4, {LR}='fast'): expected float (e.g. 1e-6), got str") in (
        messages
    )
    group_errors = [m for k, m in messages if k == N]
    assert len(group_errors) == 1 and group_errors[0].startswith(
        f"member 4 of 4 ({N}=1, {LR}=1e-06)"
    )
    assert "rollout.n>=2" in group_errors[0]
    assert {m.split(" (")[0] for _, m in messages} == {
        "member 1 of 4",
        "member 3 of 4",
        "member 4 of 4",
    }
    assert nothing_created()


@pytest.mark.django_db
def test_a_sweep_over_the_run_quota_is_refused_before_any_member_is_validated(
    owner, settings, monkeypatch
):
    settings.POSTTRAIN_MAX_QUEUED_RUNS_PER_USER = 2
    experiment = make_experiment(owner)
    calls = []
    for name in ("member_config", "config_check", "run_size_errors"):
        real = getattr(sweep_services, name)
        monkeypatch.setattr(
            sweep_services,
            name,
            lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k),
        )
    spec = {"mode": "grid", "params": {LR: [1e-6 * (i + 1) for i in range(256)]}}
    with pytest.raises(LaunchRefused) as refused:
        sweep_create(experiment=experiment, name="big", spec=spec, concurrency=1)
    assert str(refused.value) == (
        "this sweep has 256 members: POSTTRAIN_MAX_QUEUED_RUNS_PER_USER allows 2 runs per user "
        "waiting for a worker and you have 0 queued or starting, so 256 more would make 256; "
        "wait until they start (if none does, the Celery worker is down) or cancel one (a sweep "
        "launches all its members at once; sweep fewer values)"
    )
    assert calls == []
    assert nothing_created()
    assert Experiment.objects.filter(pk=experiment.pk).exists()  # the caller's, not the sweep's
    # The active limit counts the runs the owner already has.
    settings.POSTTRAIN_MAX_QUEUED_RUNS_PER_USER = 100
    settings.POSTTRAIN_MAX_ACTIVE_RUNS_PER_USER = 4
    run_create(experiment=experiment)
    refusal = r"has 4 members: .*you have 1 queued, starting or running, so 4 more would make 5;"
    with pytest.raises(LaunchRefused, match=refusal):
        lr_sweep(experiment, values=(1e-6, 2e-6, 3e-6, 4e-6))
    assert calls == [] and Run.objects.count() == 1
    sweep = lr_sweep(experiment)  # 1 + 3 runs: at the limit, not over it
    assert len(member_runs(sweep)) == 3 and calls.count("config_check") == 3


@pytest.mark.django_db
def test_a_member_a_concurrent_launch_put_over_the_run_quota_is_named_and_nothing_is_created(
    owner, settings, monkeypatch
):
    settings.POSTTRAIN_MAX_QUEUED_RUNS_PER_USER = 2
    experiment = make_experiment(owner)
    # As if another launch took the slots between the sweep's first count and its transaction.
    monkeypatch.setattr(sweep_services, "run_count_check", lambda **kwargs: None)
    with pytest.raises(LaunchRefused, match=r"member 3 of 3 .*POSTTRAIN_MAX_QUEUED_RUNS_PER_USER"):
        lr_sweep(experiment)
    assert nothing_created()
    assert Experiment.objects.filter(pk=experiment.pk).exists()  # the caller's, not the sweep's


@pytest.mark.django_db
def test_a_bad_concurrency_or_spec_is_refused_with_its_field(owner):
    experiment = make_experiment(owner)
    with pytest.raises(SweepInvalid) as info:
        sweep_create(experiment=experiment, name=" ", spec={"mode": "grid"}, concurrency=0)
    keys = {e.key for e in info.value.errors}
    assert keys == {"concurrency", "name", "params"}
    assert nothing_created()


@pytest.mark.django_db
def test_the_same_launch_key_gets_the_sweep_it_made(owner):
    experiment = make_experiment(owner)
    key = "k" * 32
    sweep = lr_sweep(experiment, launch_key=key)
    with pytest.raises(SweepAlreadyCreated) as info:
        lr_sweep(experiment, launch_key=key)
    assert info.value.sweep == sweep
    assert Run.objects.count() == 3


@pytest.mark.django_db
def test_a_member_past_the_concurrency_is_not_claimed_until_an_earlier_one_ends(owner):
    first, second, third = member_runs(lr_sweep(make_experiment(owner), concurrency=1))
    Run.objects.filter(pk=first.pk).update(status=RunStatus.RUNNING)
    assert run_claim_for_start(run_id=second.pk) is None
    assert Run.objects.get(pk=second.pk).status == RunStatus.QUEUED
    Run.objects.filter(pk=first.pk).update(status=RunStatus.SUCCEEDED)
    assert run_claim_for_start(run_id=second.pk).status == RunStatus.STARTING
    assert run_claim_for_start(run_id=third.pk) is None
    # A run of no sweep is not held back by it.
    other = run_create(experiment=make_experiment(owner, name="other"))
    assert run_claim_for_start(run_id=other.pk).status == RunStatus.STARTING


@pytest.mark.django_db
def test_cancel_ends_queued_members_at_once_and_asks_running_ones_to_stop(owner):
    sweep = lr_sweep(make_experiment(owner), concurrency=1)
    first, second, third = member_runs(sweep)
    Run.objects.filter(pk=first.pk).update(status=RunStatus.RUNNING)
    sweep_cancel(sweep=sweep)
    assert sweep.cancelled_at is not None
    statuses = {r.pk: (r.status, r.cancel_requested) for r in Run.objects.all()}
    assert statuses[first.pk] == (RunStatus.RUNNING, True)  # the driver stops after its step
    assert statuses[second.pk] == (RunStatus.CANCELLED, True)
    assert statuses[third.pk] == (RunStatus.CANCELLED, True)
    assert dispatch_queued_runs() == []  # a queued member never starts


@pytest.fixture
def private_queue():
    """Send the start messages to a queue no worker reads: only the dispatch task starts runs."""
    previous = app.conf.task_default_queue
    app.conf.task_default_queue = f"posttrain-test-{uuid.uuid4().hex[:12]}"
    yield
    app.conf.task_default_queue = previous
    for run in Run.objects.exclude(driver=""):
        stop_driver(run)


def wait_ended(runs, timeout=90):
    deadline = time.monotonic() + timeout
    for run in runs:
        while Run.objects.get(pk=run.pk).status in (RunStatus.QUEUED, *DRIVER_STATUSES):
            assert time.monotonic() < deadline, f"run {run.pk} did not end"
            time.sleep(0.2)


@pytest.mark.django_db(transaction=True)  # the drivers read the rows from their own connection
@override_settings(POSTTRAIN_MAX_RUNNING_RUNS=0)  # no server limit: only the sweep's applies
def test_the_dispatch_task_starts_members_up_to_the_concurrency_then_the_rest_as_they_end(
    owner, private_queue
):
    sweep = lr_sweep(make_experiment(owner), concurrency=2)
    first, second, third = member_runs(sweep)
    other = run_create(experiment=make_experiment(owner, name="other"))
    # Configs the driver refuses at once, so the started drivers end within seconds.
    for run in (first, second, third, other):
        config = {**run.config, "trainer": {**run.config["trainer"], "bogus_key": 1}}
        Run.objects.filter(pk=run.pk).update(config=config)
    # The third member waits; the run after it, of no sweep, is not held up behind it.
    assert dispatch_queued_runs() == [first.pk, second.pk, other.pk]
    assert Run.objects.get(pk=third.pk).status == RunStatus.QUEUED
    wait_ended([first, second])
    assert dispatch_queued_runs() == [third.pk]
    wait_ended([third, other])
    third.refresh_from_db()
    assert third.status == RunStatus.FAILED and third.driver.startswith("pid:")
