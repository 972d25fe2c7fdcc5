"""``/api/experiments``: the builder's rules and messages, as JSON, for the owner only."""

from __future__ import annotations

import pytest

from engine.config import config_to_dict
from tests.webapp.api.helpers import errors_of
from tests.webapp.fixtures import builder_data, make_experiment, tiny_config
from webapp.experiments.forms import ExperimentForm
from webapp.experiments.models import Experiment
from webapp.runs.models import Run, RunStatus

pytestmark = pytest.mark.django_db


def test_an_experiment_made_from_json_is_listed_read_cloned_archived_and_deleted(api, owner):
    config = config_to_dict(tiny_config(data__train_batch_size=8))
    response = api.post("/experiments", {"name": " json ", "tags": "A, b", "config": config})
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["name"], body["tags"], body["run_count"]) == ("json", ["a", "b"], 0)
    experiment = Experiment.objects.get(pk=body["id"])
    assert experiment.owner == owner and experiment.config["data"]["train_batch_size"] == 8
    assert body["config"] == experiment.config

    listed = api.get("/experiments").json()
    assert listed["count"] == 1 and listed["items"][0]["id"] == experiment.pk
    assert api.get("/experiments", {"tag": "b"}).json()["count"] == 1
    assert api.get("/experiments", {"q": "nothing-like-it"}).json()["count"] == 0
    assert api.get(f"/experiments/{experiment.pk}").json()["config"] == experiment.config

    clone = api.post(f"/experiments/{experiment.pk}/clone", {})
    assert clone.status_code == 201 and clone.json()["name"] == "json (copy)"
    assert clone.json()["config"] == experiment.config

    archived = api.post(f"/experiments/{experiment.pk}/archive", {"archived": True})
    assert archived.status_code == 200 and archived.json()["archived"] is True
    assert [e["id"] for e in api.get("/experiments").json()["items"]] == [clone.json()["id"]]
    assert api.get("/experiments", {"archived": True}).json()["count"] == 1

    assert api.delete(f"/experiments/{experiment.pk}").status_code == 204
    assert not Experiment.objects.filter(pk=experiment.pk).exists()


def test_an_experiment_made_from_yaml_builds_on_a_preset(api):
    text = "defaults: [grpo_tiny, _self_]\ndata:\n  train_batch_size: 4\n"
    response = api.post("/experiments", {"name": "yaml", "config_yaml": text})
    assert response.status_code == 201, response.content
    assert response.json()["config"]["data"]["train_batch_size"] == 4
    assert response.json()["config"]["actor_rollout_ref"]["model"]["path"].startswith("tiny://")


def test_a_bad_value_gets_the_builders_message_under_its_config_key(api, owner):
    form = ExperimentForm(
        builder_data(tiny_config(), owner, data__train_batch_size="0"), owner=owner
    )
    assert not form.is_valid()
    expected = form.errors["data__train_batch_size"][0]
    config = config_to_dict(tiny_config())
    config["data"]["train_batch_size"] = 0
    response = api.post("/experiments", {"name": "bad", "config": config})
    assert response.status_code == 400
    assert errors_of(response)["data.train_batch_size"] == expected
    assert not Experiment.objects.exists()


def test_unknown_keys_refused_paths_and_malformed_bodies_are_field_errors(api):
    response = api.post("/experiments", {"name": "x", "config": {"data": {"train_batch_sise": 4}}})
    assert response.status_code == 400
    assert "did you mean data.train_batch_size" in errors_of(response)["data.train_batch_sise"]

    config = config_to_dict(tiny_config(data__train_files="/etc/passwd"))
    response = api.post("/experiments", {"name": "x", "config": config})
    assert response.status_code == 400
    assert "not a place a run may read" in errors_of(response)["data.train_files"]

    response = api.post("/experiments", {"name": "x", "config_yaml": "data: [unclosed"})
    assert response.status_code == 400 and "not valid YAML" in errors_of(response)["config_yaml"]

    response = api.post("/experiments", {"name": "x"})
    assert response.status_code == 400 and "either config" in errors_of(response)["config"]

    response = api.post("/experiments", {"name": "   ", "config": config_to_dict(tiny_config())})
    assert (
        response.status_code == 400 and errors_of(response)["name"] == "give the experiment a name"
    )

    response = api.post("/experiments", {"config": {}})
    assert response.status_code == 422 and "name" in errors_of(response)

    assert not Experiment.objects.exists()


def test_launch_queues_a_run_once_per_key_and_the_users_limits_apply(api, owner, settings):
    experiment = make_experiment(owner)
    response = api.post(f"/experiments/{experiment.pk}/launch", {"launch_key": "k" * 20})
    assert response.status_code == 201, response.content
    run = Run.objects.get()
    assert response.json()["id"] == run.pk and response.json()["status"] in ("queued", "failed")
    again = api.post(f"/experiments/{experiment.pk}/launch", {"launch_key": "k" * 20})
    assert again.status_code == 200 and again.json()["id"] == run.pk
    assert Run.objects.count() == 1

    assert (
        api.post(f"/experiments/{experiment.pk}/launch", {"launch_key": "short"}).status_code == 422
    )

    Run.objects.update(status=RunStatus.QUEUED)
    settings.POSTTRAIN_MAX_QUEUED_RUNS_PER_USER = 1
    refused = api.post(f"/experiments/{experiment.pk}/launch", {})
    assert refused.status_code == 429
    assert "POSTTRAIN_MAX_QUEUED_RUNS_PER_USER allows 1" in errors_of(refused)[None]

    busy = api.delete(f"/experiments/{experiment.pk}")
    assert busy.status_code == 409 and "still active" in errors_of(busy)[None]


def test_the_actions_whose_fields_all_have_defaults_take_a_post_with_no_body(api, owner):
    # A launch with no body was a 400 "payload Field required".
    experiment = make_experiment(owner)
    response = api.bare_post(f"/experiments/{experiment.pk}/launch")
    assert response.status_code == 201, response.content
    run = Run.objects.get(experiment=experiment)
    assert response.json()["id"] == run.pk
    clone = api.bare_post(f"/experiments/{experiment.pk}/clone")
    assert clone.status_code == 201 and clone.json()["name"] == "tiny grpo (copy)"
    archived = api.bare_post(f"/experiments/{experiment.pk}/archive")
    assert archived.status_code == 200 and archived.json()["archived"] is True
    Run.objects.filter(pk=run.pk).update(status=RunStatus.CANCELLED)
    resume = api.bare_post(f"/runs/{run.pk}/resume")  # refused for its reason, not the body
    assert resume.status_code == 409 and "saved no checkpoint" in errors_of(resume)[None]


def test_another_users_experiment_is_a_404_on_every_action(api, bob, owner):
    experiment = make_experiment(owner)
    for method, path in [
        ("get", ""), ("post", "/clone"), ("post", "/archive"), ("post", "/launch"), ("delete", ""),
    ]:  # fmt: skip
        response = getattr(bob, method)(f"/experiments/{experiment.pk}{path}")
        assert response.status_code == 404, (method, path)
        assert "errors" in response.json()
    assert bob.get("/experiments").json()["count"] == 0
    assert not Run.objects.exists() and Experiment.objects.count() == 1
