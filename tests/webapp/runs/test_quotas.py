"""The server's launch limits: per-user run counts and per-run size caps, against real PostgreSQL.

A refused launch creates nothing and says which setting refused it, its limit and what the
launch asked for. The concurrent test lets two launches race for the last slot through the
pages, each on its own database connection.
"""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from engine.config import ConfigValidationError
from tests.webapp.fixtures import builder_data, make_experiment, tiny_config
from tests.webapp.runs.launching import private_broker, queued_starts, race
from webapp.experiments.models import Experiment
from webapp.runs.models import Run, RunStatus
from webapp.runs.quotas import LaunchRefused
from webapp.runs.services import run_create


def _messages(exc: ConfigValidationError) -> list[str]:
    return [str(error) for error in exc.errors]


@pytest.mark.django_db
def test_runs_waiting_for_a_worker_are_limited_per_user(owner, other_user, settings):
    settings.POSTTRAIN_MAX_QUEUED_RUNS_PER_USER = 2
    experiment = make_experiment(owner)
    first, _second = run_create(experiment=experiment), run_create(experiment=experiment)
    run_create(experiment=make_experiment(other_user))  # another user's runs do not count
    with pytest.raises(LaunchRefused) as refused:
        run_create(experiment=experiment)
    assert str(refused.value).startswith(
        "POSTTRAIN_MAX_QUEUED_RUNS_PER_USER allows 2 runs per user waiting for a worker and you "
        "have 2 queued or starting, so another would make 3;"
    )
    assert Run.objects.filter(owner=owner).count() == 2
    Run.objects.filter(pk=first.pk).update(status=RunStatus.RUNNING)
    assert run_create(experiment=experiment).number == 3


@pytest.mark.django_db
def test_active_runs_are_limited_per_user_counting_queued_starting_and_running(owner, settings):
    settings.POSTTRAIN_MAX_ACTIVE_RUNS_PER_USER = 3
    experiment = make_experiment(owner)
    runs = []
    for status in (RunStatus.SUCCEEDED, RunStatus.RUNNING, RunStatus.STARTING, RunStatus.QUEUED):
        runs.append(run_create(experiment=experiment))
        Run.objects.filter(pk=runs[-1].pk).update(status=status)
    with pytest.raises(LaunchRefused, match="POSTTRAIN_MAX_ACTIVE_RUNS_PER_USER allows 3 ") as e:
        run_create(experiment=experiment)
    assert "you have 3 queued, starting or running, so another would make 4" in str(e.value)
    assert Run.objects.count() == 4
    Run.objects.filter(pk=runs[3].pk).update(status=RunStatus.CANCELLED)
    assert run_create(experiment=experiment).number == 5


@pytest.mark.django_db
def test_ranks_reward_workers_and_steps_are_capped_per_run(owner, settings):
    settings.POSTTRAIN_MAX_RANKS = 8
    settings.POSTTRAIN_MAX_REWARD_WORKERS = 4
    settings.POSTTRAIN_MAX_TRAINING_STEPS = 100
    experiment = make_experiment(
        owner,
        trainer__n_gpus_per_node=4,
        trainer__nnodes=4,
        reward__num_workers=5,
        trainer__total_training_steps=101,
    )
    with pytest.raises(ConfigValidationError) as refused:
        run_create(experiment=experiment)
    messages = _messages(refused.value)
    assert (
        "trainer.n_gpus_per_node=4: 4 per node x trainer.nnodes=4 is 16 ranks and "
        "POSTTRAIN_MAX_RANKS allows 8 per run on this server; lower trainer.n_gpus_per_node or "
        "trainer.nnodes" in messages
    )
    assert (
        "reward.num_workers=5: POSTTRAIN_MAX_REWARD_WORKERS allows 4 reward processes per run "
        "on this server; set reward.num_workers to 4 or fewer" in messages
    )
    assert (
        "trainer.total_training_steps=101: POSTTRAIN_MAX_TRAINING_STEPS allows 100 steps per "
        "run on this server; set trainer.total_training_steps to 100 or fewer" in messages
    )
    assert not Run.objects.exists()
    settings.POSTTRAIN_MAX_RANKS = 16  # read at each launch: no restart needed
    settings.POSTTRAIN_MAX_REWARD_WORKERS = 5
    settings.POSTTRAIN_MAX_TRAINING_STEPS = 101
    assert run_create(experiment=experiment).number == 1


@pytest.mark.django_db
def test_the_reward_models_own_pool_counts_against_the_rank_cap(owner, settings):
    settings.POSTTRAIN_MAX_RANKS = 8
    reward_model = {
        "reward_model__enable": True,
        "reward_model__model__path": "tiny://reward_model",
        "reward_model__micro_batch_size_per_gpu": 8,
        "reward_model__enable_resource_pool": True,
        "reward_model__n_gpus_per_node": 4,
        "reward_model__nnodes": 2,
        "trainer__controller": "ray",  # the single-process trainer has no pools
    }
    experiment = make_experiment(
        owner, trainer__n_gpus_per_node=4, trainer__nnodes=1, **reward_model
    )
    with pytest.raises(ConfigValidationError) as refused:
        run_create(experiment=experiment)
    assert (
        "reward_model.n_gpus_per_node=4: the reward model's own pool (4 per node x "
        "reward_model.nnodes=2) adds 8 ranks to the trainer's 4, 12 in all, and "
        "POSTTRAIN_MAX_RANKS allows 8 per run on this server; lower reward_model.n_gpus_per_node "
        "or reward_model.nnodes, or set reward_model.enable_resource_pool=False to share the "
        "trainer's ranks" in _messages(refused.value)
    )
    assert not Run.objects.exists()
    # Sharing the trainer's ranks (verl's default) adds none.
    shared = make_experiment(
        owner,
        trainer__n_gpus_per_node=4,
        trainer__nnodes=1,
        **(reward_model | {"reward_model__enable_resource_pool": False}),
    )
    assert run_create(experiment=shared).number == 1


@pytest.mark.django_db
def test_steps_of_an_epoch_count_when_the_data_is_a_dataset_of_known_length(owner, settings):
    from webapp.datasets.services import dataset_create

    settings.POSTTRAIN_MAX_TRAINING_STEPS = 10
    rows = b"".join(b'{"prompt": "%d+1=", "ground_truth": "x"}\n' % i for i in range(70))
    dataset = dataset_create(
        owner=owner,
        name="sums",
        upload=SimpleUploadedFile("sums.jsonl", rows),
        data_source="exact_match",  # a scorer the server has: the config is checked whole
    )
    assert dataset.row_count == 70
    experiment = make_experiment(
        owner,
        data__train_files=dataset.path,
        data__train_batch_size=32,
        trainer__total_training_steps=None,
        trainer__total_epochs=6,
    )
    with pytest.raises(ConfigValidationError) as refused:
        run_create(experiment=experiment)
    assert (
        "trainer.total_epochs=6: 6 epochs of 2 steps (70 rows in batches of "
        "data.train_batch_size=32) is 12 steps and POSTTRAIN_MAX_TRAINING_STEPS allows 10 per "
        "run on this server; lower trainer.total_epochs or set trainer.total_training_steps"
        in _messages(refused.value)
    )
    assert run_create(experiment=make_experiment(owner, trainer__total_training_steps=10))


@pytest.mark.django_db
def test_a_refused_launch_from_the_page_says_why_and_creates_nothing(client_in, owner, settings):
    settings.POSTTRAIN_MAX_ACTIVE_RUNS_PER_USER = 1
    experiment = make_experiment(owner)
    url = reverse("experiments:launch", kwargs={"experiment_id": experiment.pk})
    assert client_in.post(url)["Location"] == Run.objects.get().get_absolute_url()
    response = client_in.post(url, follow=True)
    assert response.redirect_chain[-1][0] == experiment.get_absolute_url()
    assert "POSTTRAIN_MAX_ACTIVE_RUNS_PER_USER allows 1 active runs" in response.content.decode()
    assert Run.objects.count() == 1
    settings.POSTTRAIN_MAX_RANKS = 2
    data = builder_data(tiny_config(trainer__n_gpus_per_node=4), owner, name="big")
    response = client_in.post(reverse("experiments:new"), data)
    assert response.status_code == 400
    assert "is 4 ranks and POSTTRAIN_MAX_RANKS allows 2 per run" in response.content.decode()
    assert Experiment.objects.count() == 1 and Run.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_two_launches_at_once_cannot_both_take_the_last_slot(owner, settings):
    settings.POSTTRAIN_MAX_ACTIVE_RUNS_PER_USER = 1
    urls = [  # two experiments, so only the per-user lock stands between the launches
        reverse("experiments:launch", kwargs={"experiment_id": make_experiment(owner, name).pk})
        for name in ("a", "b")
    ]
    with private_broker() as prefix:
        pages = race(owner, [(url, {}) for url in urls])
        run = Run.objects.get()
        assert queued_starts(prefix) == [run.pk]
    assert sum(f"Run #{run.pk} queued." in page for page in pages) == 1
    assert sum("POSTTRAIN_MAX_ACTIVE_RUNS_PER_USER allows 1 active" in page for page in pages) == 1
