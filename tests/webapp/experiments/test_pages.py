"""The experiment pages a user clicks through, each checked for what it shows or changes."""

from __future__ import annotations

import pytest
import yaml
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.urls import reverse

from engine.config import config_from_yaml, config_to_dict
from tests.webapp.fixtures import make_experiment, tiny_config
from webapp.experiments.models import Experiment
from webapp.runs.models import Run, RunStatus
from webapp.runs.services import run_create

pytestmark = pytest.mark.django_db


def test_the_list_filters_by_search_tag_and_latest_run_status(client_in, owner):
    grpo = make_experiment(owner, name="grpo baseline")
    ppo = make_experiment(owner, name="ppo with critic")
    Experiment.objects.filter(pk=ppo.pk).update(tags=["ppo"], description="value model")
    Run.objects.filter(pk=run_create(experiment=grpo).pk).update(status=RunStatus.FAILED)

    def names(**query):
        response = client_in.get(reverse("experiments:list"), query)
        return sorted(e.name for e in response.context["experiments"])

    assert names() == ["grpo baseline", "ppo with critic"]
    assert names(q="VALUE") == ["ppo with critic"]
    assert names(tag="ppo") == ["ppo with critic"]
    assert names(status="failed") == ["grpo baseline"]
    Experiment.objects.filter(pk=grpo.pk).update(archived=True)
    assert names() == ["ppo with critic"]
    assert names(archived="1") == ["grpo baseline"]


def test_yaml_export_and_clone_carry_the_config(client_in, owner):
    experiment = make_experiment(owner, trainer__total_training_steps=9)
    text = client_in.get(reverse("experiments:yaml", kwargs={"experiment_id": experiment.pk}))
    assert text["Content-Disposition"] == f'attachment; filename="experiment-{experiment.pk}.yaml"'
    assert config_to_dict(config_from_yaml(text.content.decode())) == experiment.config
    run = run_create(experiment=experiment)
    run_yaml = yaml.safe_load(
        client_in.get(reverse("runs:yaml", kwargs={"run_id": run.pk})).content
    )
    assert run_yaml["trainer"]["default_local_dir"] == run.checkpoint_dir
    form = client_in.get(reverse("runs:clone", kwargs={"run_id": run.pk})).context["form"]
    assert form.initial["trainer__total_training_steps"] == "9"
    assert form.initial["name"] == f"tiny grpo (from run #{run.pk})"
    form = client_in.get(
        reverse("experiments:clone", kwargs={"experiment_id": experiment.pk})
    ).context["form"]
    assert form.initial["name"] == "tiny grpo (copy)"


def test_archive_and_delete_an_experiment(client_in, owner):
    experiment = make_experiment(owner)
    url = reverse("experiments:archive", kwargs={"experiment_id": experiment.pk})
    client_in.post(url)
    assert Experiment.objects.get().archived
    client_in.post(url)
    assert not Experiment.objects.get().archived
    delete = reverse("experiments:delete", kwargs={"experiment_id": experiment.pk})
    assert "cannot be undone" in client_in.get(delete).content.decode()
    client_in.post(delete)
    assert not Experiment.objects.exists()


def test_a_chosen_dataset_feeds_the_config_with_its_key_map(client_in, owner):
    from tests.webapp.fixtures import builder_data
    from webapp.datasets.services import dataset_create

    upload = SimpleUploadedFile("sums.jsonl", b'{"question": "2+3=", "answer": "5"}\n')
    dataset = dataset_create(
        owner=owner,
        name="sums",
        upload=upload,
        key_map={"prompt": "question", "ground_truth": "answer"},
        data_source="tiny_arithmetic",
    )
    data = builder_data(tiny_config(), owner, train_dataset=str(dataset.pk), launch=None)
    response = client_in.post(reverse("experiments:new"), data)
    experiment = Experiment.objects.get()
    assert response["Location"] == experiment.get_absolute_url() and not Run.objects.exists()
    assert experiment.config["data"]["train_files"] == dataset.path
    assert experiment.config["data"]["data_key_map"] == {}  # the preset's files keep theirs
    assert experiment.config["data"]["file_key_maps"] == {
        dataset.path: {"prompt": "question", "ground_truth": "answer"}
    }


def test_demo_command_creates_the_user_and_experiment_once(capsys):
    call_command("posttrain_demo", "--no-launch", "--steps", "5", "--url", "http://host:8123")
    call_command("posttrain_demo", "--no-launch")
    user = get_user_model().objects.get(username="demo")
    assert user.check_password("demo")
    experiment = Experiment.objects.get()
    assert experiment.owner == user and experiment.preset == "grpo_tiny"
    assert experiment.config["trainer"]["total_training_steps"] == 5
    assert not Run.objects.exists()
    out = capsys.readouterr().out
    assert f"http://host:8123/experiments/{experiment.pk}/" in out
