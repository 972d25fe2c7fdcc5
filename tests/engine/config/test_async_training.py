"""The asynchronous-training keys: hybrid_engine=False honoured (the one-step-off trainer) with
every setting it cannot honour refused by name, verl's fully-async keys selecting and scheduling
the fully-async trainer, and what it cannot honour refused by name."""

from __future__ import annotations

import pytest

from engine.config import ConfigValidationError, load_config, validate_config
from engine.config.async_training import fully_async_settings, is_fully_async

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


@pytest.mark.parametrize("fully_async", [False, True])
def test_either_async_trainer_runs_on_the_ray_controller(fully_async):
    from engine.trainer.ray_async import RayFullyAsyncPPOTrainer, RayOneStepOffPPOTrainer
    from engine.trainer.run import trainer_class

    overrides = [ONE_STEP_OFF, "trainer.controller=ray", "trainer.n_gpus_per_node=2"]
    if fully_async:
        overrides.append("async_training.staleness_threshold=0.5")
    config = load_config("grpo_tiny.yaml", overrides=overrides)
    assert validate_config(config, check_files=False) == []
    expected = RayFullyAsyncPPOTrainer if fully_async else RayOneStepOffPPOTrainer
    assert trainer_class(config) is expected


@pytest.mark.parametrize(
    ("overrides", "key", "fix"),
    [
        (["algorithm.adv_estimator=gae"], "critic.enable", "critic-free estimator"),
        (["critic.enable=True"], "critic.enable", "keep actor_rollout_ref.hybrid_engine=True"),
        (["trainer.device=cuda"], "trainer.device", "set trainer.device=cpu"),
        (["algorithm.adv_estimator=remax"], "algorithm.adv_estimator", "another estimator"),
        (
            ["algorithm.filter_groups.enable=True", "data.gen_batch_size=8"],
            "algorithm.filter_groups.enable",
            "turn dynamic sampling off",
        ),
        (["actor_rollout_ref.model.lora_rank=4"], "actor_rollout_ref.model.lora_rank", "=0"),
        (
            [
                "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                "trainer.n_gpus_per_node=2",
            ],
            "actor_rollout_ref.rollout.tensor_model_parallel_size",
            "tensor_model_parallel_size=1",
        ),
        (
            ["actor_rollout_ref.rollout.name=sglang"],
            "actor_rollout_ref.rollout.name",
            "set actor_rollout_ref.rollout.name=hf or vllm",
        ),
    ],
)
def test_a_setting_one_step_off_cannot_honour_is_refused_by_name(overrides, key, fix):
    errors = errors_of(ONE_STEP_OFF, *overrides)
    assert key in errors, errors
    assert "actor_rollout_ref.hybrid_engine=False" in errors[key]
    assert fix in errors[key]


@pytest.mark.parametrize(
    "overrides",
    [
        ["actor_rollout_ref.rollout.name=vllm"],
        ["actor_rollout_ref.rollout.multi_turn.enable=True"],
        ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.multi_turn.enable=True"],
    ],
)
def test_the_worker_runs_vllm_and_multi_turn_rollouts(overrides):
    config = load_config("grpo_tiny.yaml", overrides=[ONE_STEP_OFF, *overrides])
    assert validate_config(config, check_files=False) == []


def test_the_same_settings_are_fine_in_the_synchronous_trainer():
    config = load_config("grpo_tiny.yaml", overrides=["algorithm.adv_estimator=rloo"])
    assert validate_config(config, check_files=False) == []


def test_more_than_one_rollout_worker_is_refused_with_the_reason():
    errors = errors_of(ONE_STEP_OFF, "rollout.n_gpus_per_node=8", "rollout.nnodes=2")
    assert "one rollout worker process" in errors["rollout.n_gpus_per_node"]
    assert "one rollout worker process" in errors["rollout.nnodes"]


FULLY_ASYNC = (ONE_STEP_OFF, "async_training.staleness_threshold=0.1")


def test_verls_fully_async_keys_on_the_tiny_preset_are_valid():
    config = load_config(
        "grpo_tiny.yaml",
        overrides=[
            *FULLY_ASYNC,
            "async_training.trigger_parameter_sync_step=4",
            "async_training.require_batches=1",
            "async_training.partial_rollout=True",
            "async_training.use_rollout_log_probs=True",
            "async_training.compute_prox_log_prob=False",
            "async_training.checkpoint_engine.enable=False",
            "rollout.n=8",
            "rollout.total_rollout_steps=320",
            "rollout.test_freq=2",
        ],
    )
    assert validate_config(config, check_files=False) == []
    assert is_fully_async(config)
    settings = fully_async_settings(config)
    # verl's max_required_samples: floor(1 x 4 x 1.1) = 4 chunks, so at most 3 updates behind.
    assert (settings.queue_chunks, settings.max_staleness) == (4, 3)


def test_the_selecting_keys_take_verls_defaults_when_left_out():
    config = load_config(
        "grpo_tiny.yaml", overrides=[ONE_STEP_OFF, "async_training.require_batches=1"]
    )
    assert is_fully_async(config)
    assert fully_async_settings(config)[:3] == (0.1, 4, 1)
    assert not is_fully_async(load_config("grpo_tiny.yaml", overrides=[ONE_STEP_OFF]))


@pytest.mark.parametrize(
    ("threshold", "sync_step", "batches", "queue", "bound"),
    [
        (0, 1, 1, 1, 0),
        (0, 2, 1, 2, 1),
        (0.5, 2, 2, 6, 2),
        (0.29, 100, 1, 129, 128),
        (1, 1, 3, 6, 1),
    ],
)
def test_the_queue_and_the_staleness_bound_follow_verls_budget(
    threshold, sync_step, batches, queue, bound
):
    config = load_config(
        "grpo_tiny.yaml",
        overrides=[
            ONE_STEP_OFF,
            f"async_training.staleness_threshold={threshold}",
            f"async_training.trigger_parameter_sync_step={sync_step}",
            f"async_training.require_batches={batches}",
        ],
    )
    settings = fully_async_settings(config)
    assert (settings.queue_chunks, settings.max_staleness) == (queue, bound)


@pytest.mark.parametrize(
    ("overrides", "key", "fix"),
    [
        (["async_training.staleness_threshold=-0.1"], "async_training.staleness_threshold", ">= 0"),
        (
            [
                "async_training.staleness_threshold=100000",
                "async_training.trigger_parameter_sync_step=4",
            ],
            "async_training.staleness_threshold",
            "lower staleness_threshold",
        ),
        (
            ["async_training.trigger_parameter_sync_step=0"],
            "async_training.trigger_parameter_sync_step",
            "> 0",
        ),
        (["async_training.require_batches=2"], "data.train_batch_size", "data.train_batch_size=64"),
        (
            ["async_training.partial_rollout=True", "actor_rollout_ref.rollout.name=sglang"],
            "async_training.partial_rollout",
            "rollout.name=hf or vllm without multi_turn",
        ),
        (
            [
                "async_training.partial_rollout=True",
                "actor_rollout_ref.rollout.multi_turn.enable=True",
            ],
            "async_training.partial_rollout",
            "partial_rollout=False",
        ),
        (
            ["async_training.checkpoint_engine.enable=True"],
            "async_training.checkpoint_engine.enable",
            "enable=False",
        ),
        (
            [
                "async_training.use_rollout_log_probs=True",
                "async_training.compute_prox_log_prob=True",
            ],
            "async_training.compute_prox_log_prob",
            "use_rollout_log_probs=False",
        ),
        (
            [
                "actor_rollout_ref.actor.use_rollout_log_probs=True",
                "async_training.use_rollout_log_probs=False",
            ],
            "async_training.use_rollout_log_probs",
            "set one value",
        ),
        (["rollout.total_rollout_steps=8"], "rollout.total_rollout_steps", "at least 32"),
        (
            ["async_training.trigger_parameter_sync_step=5", "trainer.total_training_steps=5"],
            "async_training.trigger_parameter_sync_step",
            "set at most 4",
        ),
        (["rollout.total_epochs=2"], "rollout.total_epochs", "trainer.total_epochs"),
        (["rollout.n=4"], "rollout.n", "actor_rollout_ref.rollout.n"),
        (["critic.enable=True"], "critic.enable", "older policy"),
    ],
)
def test_a_fully_async_setting_the_engine_cannot_honour_is_refused_by_name(overrides, key, fix):
    errors = errors_of(*FULLY_ASYNC, *overrides)
    assert key in errors, errors
    assert fix in errors[key], errors[key]


@pytest.mark.parametrize("rollout", ["hf", "vllm"])
def test_partial_rollout_is_valid_with_both_rollouts_that_can_interrupt(rollout):
    overrides = [
        *FULLY_ASYNC,
        "async_training.partial_rollout=True",
        f"actor_rollout_ref.rollout.name={rollout}",
    ]
    assert (
        validate_config(load_config("grpo_tiny.yaml", overrides=overrides), check_files=False) == []
    )


@pytest.mark.parametrize(
    "override",
    [
        "async_training.partial_rollout=False",
        "async_training.use_rollout_log_probs=True",
        "async_training.compute_prox_log_prob=True",
        "async_training.checkpoint_engine.enable=False",
        "rollout.total_rollout_steps=100",
        "rollout.test_freq=1",
    ],
)
def test_a_fully_async_key_without_the_fully_async_trainer_says_how_to_select_it(override):
    key = override.split("=")[0]
    message = errors_of(ONE_STEP_OFF, override)[key]
    assert "only the fully-async trainer reads it" in message
    assert "async_training.staleness_threshold" in message


def test_the_selecting_keys_need_hybrid_engine_false():
    message = errors_of("async_training.staleness_threshold=0.1")[
        "async_training.staleness_threshold"
    ]
    assert "actor_rollout_ref.hybrid_engine=False" in message
