"""``/api/experiments``: the builder's rules and messages, as JSON, for the owner only."""

from __future__ import annotations

import pytest

from engine.config import config_to_dict
from tests.webapp.api.helpers import errors_of
from tests.webapp.fixtures import builder_data, make_experiment, tiny_config
from webapp.experiments.forms import ExperimentForm
from webapp.experiments.models import Experiment
from webapp.runs.models import Run, RunStatus, run_dir

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


def model_run(user, experiment) -> tuple[Run, str]:
    """Return a finished run of ``user`` and the folder of its exported model."""
    run = Run.objects.create(
        experiment=experiment, owner=user, number=1, status=RunStatus.SUCCEEDED, config={}
    )
    folder = run_dir(run.pk) / "checkpoints" / "global_step_1" / "actor" / "huggingface"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "qwen2", "attention_dropout": 0.0}')
    return run, str(folder)


def test_override_config_cannot_reach_another_members_model_or_write_a_folder(
    api, owner, other_user, tmp_path
):
    _, own = model_run(owner, make_experiment(owner))
    theirs_run, theirs = model_run(other_user, make_experiment(other_user))
    up = "../" * 5 + f"{theirs_run.pk}/checkpoints/global_step_1/actor/huggingface"
    hostile = {
        "subfolder": {"subfolder": theirs},
        "subfolder up": {"subfolder": up},
        "offload_folder": {"offload_folder": str(tmp_path / "dropped"), "device_map": {"": "disk"}},
        "trust_remote_code": {"trust_remote_code": True},
        "auto_map": {"auto_map": {"AutoModelForCausalLM": "evil--modeling.Evil"}},
        "_name_or_path": {"_name_or_path": theirs},
    }
    key = "actor_rollout_ref.model.override_config"
    for case, overrides in hostile.items():
        config = config_to_dict(tiny_config(actor_rollout_ref__model__path=own))
        config["actor_rollout_ref"]["model"]["override_config"] = overrides
        response = api.post("/experiments", {"name": case, "config": config})
        assert response.status_code == 400, (case, response.content)
        name = case.split()[0]
        assert f"{key}.{name}" in errors_of(response), (case, errors_of(response))
    for where in ("critic", "reward_model"):
        config = config_to_dict(tiny_config(actor_rollout_ref__model__path=own))
        config[where]["model"]["override_config"] = {"subfolder": theirs}
        response = api.post("/experiments", {"name": where, "config": config})
        assert response.status_code == 400
        assert f"{where}.model.override_config.subfolder" in errors_of(response), where
    config = config_to_dict(tiny_config(actor_rollout_ref__model__path=own))
    config["actor_rollout_ref"]["rollout"]["engine_kwargs"]["vllm"] = {"kv_cache_dtype": theirs}
    config["custom_reward_function"]["reward_kwargs"] = {"reward_cls": "os.system"}
    errors = errors_of(api.post("/experiments", {"name": "kwargs", "config": config}))
    assert "actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype" in errors
    assert "custom_reward_function.reward_kwargs.reward_cls" in errors
    assert not Experiment.objects.filter(owner=owner, name__in=[*hostile, "kwargs"]).exists()
    assert not (tmp_path / "dropped").exists()

    config = config_to_dict(tiny_config(actor_rollout_ref__model__path=own))
    config["actor_rollout_ref"]["model"]["override_config"] = {"attention_dropout": 0.1}
    response = api.post("/experiments", {"name": "dropout", "config": config})
    assert response.status_code == 201, response.content
    assert response.json()["config"]["actor_rollout_ref"]["model"]["override_config"] == {
        "attention_dropout": 0.1
    }


def test_a_refused_model_folder_says_nothing_of_its_config_json_through_override_config(
    api, owner, other_user
):
    _, theirs = model_run(other_user, make_experiment(other_user))
    for overrides in ({"attention_dropout": 0.1}, {"model_type_guess": 1}, {"subfolder": "x"}):
        config = config_to_dict(tiny_config(actor_rollout_ref__model__path=theirs))
        config["actor_rollout_ref"]["model"]["override_config"] = overrides
        config["critic"]["model"]["override_config"] = overrides  # the critic reads that folder
        response = api.post("/experiments", {"name": "probe", "config": config})
        assert response.status_code == 400
        assert list(errors_of(response)) == ["actor_rollout_ref.model.path"], overrides
