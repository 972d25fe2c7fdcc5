"""A real tiny run whose reward function always raises: it stops after the studio's streak of
failing steps and ends failed, naming the error (issue 39), instead of "succeeded"."""

from __future__ import annotations

import pytest

from tests.webapp.fixtures import make_experiment
from tests.workers.test_lifecycle import SMALL, tiny_cache  # noqa: F401  (a fixture)
from webapp.runs.driver_writes import run_claim_for_start
from webapp.runs.models import Run, RunStatus
from webapp.runs.services import run_create
from workers.driver import drive

BROKEN = '''"""A reward that has no score for any data source."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    raise NotImplementedError(f"no reward function for data_source {data_source!r}")
'''


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.django_db
def test_a_run_whose_rewards_all_fail_stops_and_ends_failed(owner, studio_dirs, tiny_cache):  # noqa: F811
    module = studio_dirs / "rewards" / "broken.py"
    module.write_text(BROKEN)
    experiment = make_experiment(
        owner,
        **SMALL,
        trainer__total_training_steps=8,
        trainer__test_freq=-1,
        trainer__val_before_train=False,
        custom_reward_function__path=str(module),
        custom_reward_function__name="compute_score",
    )
    run = run_create(experiment=experiment)
    run_claim_for_start(run_id=run.pk)
    assert drive(run.pk, publish=False) == RunStatus.FAILED
    run = Run.objects.get(pk=run.pk)
    assert run.status == RunStatus.FAILED
    # Steps 1-3 fail; the trainer sees the stop before step 4's end and stops after it.
    assert run.latest_step == 4 and run.total_steps == 8
    assert run.error.startswith(
        "the reward function failed on more than 50% of the samples in each of steps 1-3"
    )
    assert "NotImplementedError: no reward function for data_source 'tiny_arithmetic'" in run.error
