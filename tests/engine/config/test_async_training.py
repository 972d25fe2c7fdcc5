"""The asynchronous-training keys: hybrid_engine=False honoured (the one-step-off trainer) with
every setting it cannot honour refused by name, and verl's fully-async keys refused."""

from __future__ import annotations

import pytest

from engine.config import ConfigValidationError, load_config, validate_config

ONE_STEP_OFF = "actor_rollout_ref.hybrid_engine=False"


def errors_of(*overrides: str) -> dict[str, str]:
    """Return {key: message} of every error ``validate_config`` raises for the tiny preset."""
    config = load_config("grpo_tiny.yaml", overrides=list(overrides))
    with pytest.raises(ConfigValidationError) as caught:
        validate_config(config, check_files=False)
    return {error.key: error.message for error in caught.value.errors}


def test_one_step_off_on_the_tiny_preset_is_valid():
    config = load_config(
        "grpo_tiny.yaml",
        overrides=[ONE_STEP_OFF, "rollout.nnodes=1", "rollout.n_gpus_per_node=1"],
    )
    assert validate_config(config, check_files=False) == []
    assert config.actor_rollout_ref.hybrid_engine is False


@pytest.mark.parametrize(
    ("overrides", "key", "fix"),
    [
        (["algorithm.adv_estimator=gae"], "critic.enable", "critic-free estimator"),
        (["critic.enable=True"], "critic.enable", "keep actor_rollout_ref.hybrid_engine=True"),
        (["trainer.controller=ray"], "trainer.controller", "set trainer.controller=local"),
        (["trainer.device=cuda"], "trainer.device", "set trainer.device=cpu"),
        (["algorithm.adv_estimator=remax"], "algorithm.adv_estimator", "another estimator"),
        (
            ["algorithm.filter_groups.enable=True", "data.gen_batch_size=8"],
            "algorithm.filter_groups.enable",
            "turn dynamic sampling off",
        ),
        (["actor_rollout_ref.model.lora_rank=4"], "actor_rollout_ref.model.lora_rank", "=0"),
        (
            ["actor_rollout_ref.rollout.multi_turn.enable=True"],
            "actor_rollout_ref.rollout.multi_turn.enable",
            "turn multi_turn off",
        ),
    ],
)
def test_a_setting_one_step_off_cannot_honour_is_refused_by_name(overrides, key, fix):
    errors = errors_of(ONE_STEP_OFF, *overrides)
    assert key in errors, errors
    assert "actor_rollout_ref.hybrid_engine=False" in errors[key]
    assert fix in errors[key]


def test_the_same_settings_are_fine_in_the_synchronous_trainer():
    config = load_config("grpo_tiny.yaml", overrides=["algorithm.adv_estimator=rloo"])
    assert validate_config(config, check_files=False) == []


def test_more_than_one_rollout_worker_is_refused_with_the_reason():
    errors = errors_of(ONE_STEP_OFF, "rollout.n_gpus_per_node=8", "rollout.nnodes=2")
    assert "one rollout worker process" in errors["rollout.n_gpus_per_node"]
    assert "one rollout worker process" in errors["rollout.nnodes"]


@pytest.mark.parametrize(
    "override",
    [
        "async_training.staleness_threshold=0.1",
        "async_training.trigger_parameter_sync_step=4",
        "async_training.require_batches=1",
        "async_training.partial_rollout=True",
        "async_training.checkpoint_engine.enable=True",
        "rollout.total_rollout_steps=100",
    ],
)
def test_verls_fully_async_keys_are_refused_pointing_at_one_step_off(override):
    key = override.split("=")[0]
    message = errors_of(override)[key]
    assert "fully-asynchronous trainer" in message and "hybrid_engine=False" in message


def test_async_trainings_use_rollout_log_probs_points_at_the_actor_key():
    message = errors_of("async_training.use_rollout_log_probs=True")[
        "async_training.use_rollout_log_probs"
    ]
    assert "actor_rollout_ref.actor.use_rollout_log_probs" in message
