"""The pages and actions a user clicks through, each checked for what it shows or changes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.urls import reverse

from engine.config import config_from_yaml, config_to_dict
from tests.webapp.fixtures import make_experiment, tiny_config
from webapp.datasets.models import Dataset
from webapp.experiments.models import Experiment
from webapp.runs.models import MetricPoint, Run, RunStatus
from webapp.runs.services import run_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def client_in(client, owner):
    client.force_login(owner)
    return client


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


def test_launch_cancel_resume_and_delete_from_the_pages(client_in, owner):
    experiment = make_experiment(owner)
    response = client_in.post(
        reverse("experiments:launch", kwargs={"experiment_id": experiment.pk})
    )
    run = Run.objects.get()
    assert response["Location"] == run.get_absolute_url() and run.status == RunStatus.QUEUED
    client_in.post(reverse("runs:cancel", kwargs={"run_id": run.pk}))
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    response = client_in.post(reverse("runs:resume", kwargs={"run_id": run.pk}), follow=True)
    assert "saved no checkpoint to resume from" in response.content.decode()
    checkpoint = Path(run.checkpoint_dir) / "global_step_4"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.pt").write_bytes(b"x")
    response = client_in.post(reverse("runs:resume", kwargs={"run_id": run.pk}))
    child = Run.objects.get(parent=run)
    assert response["Location"] == child.get_absolute_url()
    assert child.config["trainer"]["resume_from_path"] == str(checkpoint)
    response = client_in.post(reverse("runs:delete", kwargs={"run_id": child.pk}), follow=True)
    assert "cancel it before deleting it" in response.content.decode()
    client_in.post(reverse("runs:delete", kwargs={"run_id": run.pk}))
    assert not Run.objects.filter(pk=run.pk).exists()


def test_run_page_summarises_the_latest_metrics_and_the_diff_shows_changed_keys(client_in, owner):
    lr = tiny_config().actor_rollout_ref.actor.optim.lr
    first = run_create(experiment=make_experiment(owner, name="a"))
    second = run_create(
        experiment=make_experiment(owner, name="b", actor_rollout_ref__actor__optim__lr=lr * 2)
    )
    MetricPoint.objects.create(run=first, step=1, wall_time="2025-01-01T00:00Z", metrics={"x": 1.0})
    MetricPoint.objects.create(
        run=first,
        step=2,
        wall_time="2025-01-01T00:01Z",
        metrics={"zeta": 2.0, "critic/score/mean": 0.625},
    )
    page = client_in.get(reverse("runs:detail", kwargs={"run_id": first.pk}))
    assert page.context["metrics_step"] == 2
    assert page.context["metrics"] == [("critic/score/mean", 0.625), ("zeta", 2.0)]
    response = client_in.get(
        reverse("runs:diff-pick", kwargs={"run_id": first.pk}), {"other": second.pk}
    )
    assert response["Location"] == reverse(
        "runs:diff", kwargs={"run_id": first.pk, "other_run_id": second.pk}
    )
    rows = client_in.get(response["Location"]).context["rows"]
    assert [(r.key, r.left, r.right) for r in rows] == [
        ("actor_rollout_ref.actor.optim.lr", lr, lr * 2)
    ]


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
    assert form.initial["name"] == "tiny grpo (from run #1)"
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


def test_dataset_upload_previews_rows_and_remaps_columns(client_in, owner):
    text = b'{"question": "2+3=", "answer": "5"}\n{"question": "7+1=", "answer": "8"}\n'
    response = client_in.post(
        reverse("datasets:upload"),
        {"name": "", "file": SimpleUploadedFile("sums.jsonl", text), "map_prompt": "question"},
    )
    dataset = Dataset.objects.get()
    assert response["Location"] == dataset.get_absolute_url()
    assert (dataset.name, dataset.format, dataset.row_count) == ("sums", "jsonl", 2)
    assert dataset.key_map == {"prompt": "question"}
    assert dataset.preview["columns"] == ["question", "answer"]
    assert dataset.preview["mapped"][0] == {
        "prompt": "2+3=",
        "ground_truth": None,
        "data_source": "sums",
    }
    client_in.post(
        dataset.get_absolute_url(), {"map_prompt": "question", "map_ground_truth": "answer"}
    )
    dataset.refresh_from_db()
    assert dataset.preview["errors"] == []
    assert dataset.preview["mapped"][0]["prompt"] == "2+3="
    assert dataset.preview["mapped"][0]["ground_truth"] == "5"
    page = client_in.get(dataset.get_absolute_url()).content.decode()
    assert "7+1=" in page
    download = client_in.get(reverse("datasets:download", kwargs={"dataset_id": dataset.pk}))
    assert b"".join(download.streaming_content) == text
    bad = client_in.post(reverse("datasets:upload"), {"file": SimpleUploadedFile("x.txt", b"hi")})
    assert "unsupported file type &#x27;.txt&#x27;" in bad.content.decode()
    path = Path(dataset.path)
    client_in.post(reverse("datasets:delete", kwargs={"dataset_id": dataset.pk}))
    assert not Dataset.objects.exists() and not path.exists()


def test_a_chosen_dataset_feeds_the_config_with_its_key_map(client_in, owner):
    from tests.webapp.fixtures import builder_data
    from webapp.datasets.services import dataset_create

    upload = SimpleUploadedFile("sums.jsonl", b'{"question": "2+3=", "answer": "5"}\n')
    dataset = dataset_create(
        owner=owner,
        name="sums",
        upload=upload,
        key_map={"prompt": "question", "ground_truth": "answer"},
    )
    data = builder_data(tiny_config(), owner, train_dataset=str(dataset.pk), launch=None)
    response = client_in.post(reverse("experiments:new"), data)
    experiment = Experiment.objects.get()
    assert response["Location"] == experiment.get_absolute_url() and not Run.objects.exists()
    assert experiment.config["data"]["train_files"] == dataset.path
    assert experiment.config["data"]["data_key_map"] == {
        "prompt": "question",
        "ground_truth": "answer",
    }


def test_signup_is_off_unless_enabled(client, settings):
    assert client.get(reverse("signup")).status_code == 404
    settings.POSTTRAIN_ALLOW_SIGNUP = True
    response = client.post(
        reverse("signup"),
        {
            "username": "newbie",
            "password1": "a-long-passphrase-9",
            "password2": "a-long-passphrase-9",
        },
    )
    assert response.status_code == 302
    assert get_user_model().objects.filter(username="newbie").exists()


def test_login_and_logout_pages(client, owner):
    assert "Log in" in client.get(reverse("login")).content.decode()
    response = client.post(reverse("login"), {"username": "alice", "password": "alice-pass"})
    assert response.status_code == 302
    assert client.get(reverse("experiments:list")).status_code == 200
    client.post(reverse("logout"))
    assert client.get(reverse("experiments:list")).status_code == 302


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
