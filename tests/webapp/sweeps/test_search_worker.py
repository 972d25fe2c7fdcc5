"""A tpe sweep with a pruner on the real Celery worker and real drivers: the dispatch task draws
each member as the one before ends, the pruner stops members at their validation step, and the
sweep ends with its count of members."""

from __future__ import annotations

import time

import pytest
from django.test import override_settings

from tests.webapp.fixtures import make_experiment
from tests.workers.test_lifecycle import SMALL, start_worker, tiny_cache  # noqa: F401
from webapp.runs.driver_writes import metric_point_upsert
from webapp.runs.models import ACTIVE_STATUSES, Run, RunStatus
from webapp.sweeps.selectors import member_histories, sweep_list_for_user
from webapp.sweeps.services import sweep_create
from workers.tasks import dispatch_queued_runs

LR = "actor_rollout_ref.actor.optim.lr"
METRIC = "val-core/tiny_arithmetic/reward/mean@1"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)  # the worker and the drivers read the rows themselves
@override_settings(POSTTRAIN_MAX_RUNNING_RUNS=0)
def test_a_tpe_sweep_on_the_worker_prunes_members_behind_a_finished_one_and_draws_the_next(
    owner,
    start_worker,  # noqa: F811
):
    experiment = make_experiment(
        owner,
        **SMALL,
        trainer__total_training_steps=3,
        trainer__test_freq=1,
        trainer__val_before_train=False,
    )
    sweep = sweep_create(
        experiment=experiment,
        name="search",
        spec={
            "mode": "tpe",
            "count": 3,
            "seed": 0,
            "n_startup_trials": 1,
            "params": {LR: {"log_uniform": [1e-6, 1e-5]}},
            "objective": {"metric": METRIC, "direction": "maximize"},
            "pruner": {"type": "median", "n_startup_trials": 1},
        },
        concurrency=1,
    )
    # The first member is made a finished one that no member can reach (a reward mean of 10):
    # every later member falls below the median at its first validation step.
    first = sweep.members.get(index=1).run
    Run.objects.filter(pk=first.pk).update(status=RunStatus.SUCCEEDED)
    for step in (1, 2, 3):
        metric_point_upsert(run_id=first.pk, step=step, metrics={METRIC: 10.0})
    start_worker()
    deadline = time.monotonic() + 600
    # The beat's part: ask the worker to dispatch, as the schedule does every 5 s.
    while (
        sweep.members.count() < 3
        or Run.objects.filter(sweep_member__sweep=sweep, status__in=ACTIVE_STATUSES).exists()
    ):
        statuses = list(sweep.members.values_list("index", "run__status"))
        assert time.monotonic() < deadline, statuses
        dispatch_queued_runs.delay()
        time.sleep(2)
    members = list(sweep.members.select_related("run").order_by("index"))
    for member in members[1:]:
        run = member.run
        assert member.pruned is not None, (run.status, run.error)
        assert {k: member.pruned[k] for k in ("metric", "step", "threshold", "pruner")} == {
            "metric": METRIC,
            "step": 1,
            "threshold": 10.0,
            "pruner": "median",
        }
        assert 0.0 <= member.pruned["value"] <= 1.0
        # It stops after the step it was judged at, or the next (the recorder writes a step
        # while the trainer runs the next one), before its last.
        assert run.status == RunStatus.CANCELLED, (run.status, run.error)
        assert run.latest_step < run.total_steps == 3
    # One at a time: the third member was drawn only once the pruned second one had ended.
    second, third = members[1].run, members[2].run
    assert third.created_at >= second.finished_at
    assert [h.state for h in member_histories(sweep=sweep)] == ["complete", "pruned", "pruned"]
    assert sweep_list_for_user(user=owner).get(pk=sweep.pk).status == "finished"
