"""Services of experiments against a real PostgreSQL: the config, its rewards and data checked."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from engine.config import ConfigValidationError, validate_config
from tests.webapp.fixtures import errors_by_key, make_experiment, tiny_config
from webapp.datasets.services import dataset_create
from webapp.experiments.models import Experiment
from webapp.experiments.services import experiment_create

pytestmark = pytest.mark.django_db


def test_experiment_create_stores_the_validated_config_and_clean_tags(owner):
    experiment = make_experiment(owner)
    assert experiment.tags == ["tiny", "grpo"]
    assert experiment.config["algorithm"]["adv_estimator"] == "grpo"
    preset = tiny_config()
    assert (
        experiment.config["actor_rollout_ref"]["rollout"]["n"] == preset.actor_rollout_ref.rollout.n
    )


def test_experiment_create_rejects_what_the_engine_rejects_and_creates_nothing(owner):
    config = tiny_config(actor_rollout_ref__rollout__n=1)
    with pytest.raises(ConfigValidationError) as engine_error:
        validate_config(config)
    with pytest.raises(ConfigValidationError) as studio_error:
        experiment_create(owner=owner, name="bad", config=config)
    assert errors_by_key(studio_error.value) == errors_by_key(engine_error.value)
    assert "actor_rollout_ref.rollout.n" in errors_by_key(studio_error.value)
    assert not Experiment.objects.exists()


def test_custom_reward_code_must_come_from_the_installed_modules(owner, studio_dirs):
    outside = studio_dirs / "elsewhere.py"
    outside.write_text("def compute_score(*a, **k):\n    return 1.0\n")
    config = tiny_config(custom_reward_function__path=str(outside))
    with pytest.raises(ConfigValidationError) as exc:
        experiment_create(owner=owner, name="x", config=config)
    message = errors_by_key(exc.value)["custom_reward_function.path"]
    assert "reward modules installed in" in message
    inside = tiny_config(
        custom_reward_function__path=str(studio_dirs / "rewards" / "house_rewards.py"),
        custom_reward_function__name="length_penalty",
    )
    experiment_create(owner=owner, name="ok", config=inside)


def test_module_imports_are_not_available_from_the_studio(owner):
    config = tiny_config(actor_rollout_ref__model__external_lib="os")
    with pytest.raises(ConfigValidationError) as exc:
        experiment_create(owner=owner, name="x", config=config)
    assert (
        "not available from the studio"
        in errors_by_key(exc.value)["actor_rollout_ref.model.external_lib"]
    )


def test_an_uploaded_file_must_be_one_of_the_owners_datasets(owner, other_user):
    upload = SimpleUploadedFile("math.jsonl", b'{"prompt": "1+1=", "ground_truth": "2"}\n')
    theirs = dataset_create(owner=other_user, name="theirs", upload=upload)
    config = tiny_config(data__train_files=theirs.path)
    with pytest.raises(ConfigValidationError) as exc:
        experiment_create(owner=owner, name="x", config=config)
    assert errors_by_key(exc.value)["data.train_files"].startswith(
        "this file is not one of your datasets"
    )
    experiment_create(owner=other_user, name="mine", config=config)
