"""Numbers and sizes a run could not hold are refused by validate_config, the limit named."""

from __future__ import annotations

import pytest

from engine.config import (
    ConfigValidationError,
    iter_field_specs,
    load_config,
    set_value,
    validate_config,
)
from engine.config.fields import MAX_BATCH, MAX_STEPS, MAX_TOKENS

STEPS_MESSAGE = "must be <= 2147483647 (step numbers are stored as 32-bit integers); lower it"


def problems(**values):
    """Return {key: message} of validate_config's errors for grpo_tiny with dotted keys set."""
    config = load_config("grpo_tiny")
    for key, value in values.items():
        set_value(config, key.replace("__", "."), value)
    try:
        validate_config(config, check_files=False)
    except ConfigValidationError as exc:
        return {error.key: error.message for error in exc.errors}
    return {}


@pytest.mark.parametrize("steps", [10**12, 2**31])
def test_a_step_count_over_what_the_database_stores_is_refused_naming_the_maximum(steps):
    assert problems(trainer__total_training_steps=steps) == {
        "trainer.total_training_steps": STEPS_MESSAGE
    }


def test_the_largest_step_count_the_database_stores_passes():
    assert problems(trainer__total_training_steps=2**31 - 1) == {}
    assert MAX_STEPS == 2**31 - 1


def test_every_count_the_database_stores_from_the_config_has_a_maximum_it_holds():
    # Run.total_steps and latest_step (total_training_steps, or epochs x batches), each sample's
    # step, index in its group (rollout.n) and response length, and the step keys beside them.
    stored = [
        "trainer.total_training_steps",
        "trainer.total_epochs",
        "trainer.save_freq",
        "trainer.test_freq",
        "trainer.critic_warmup",
        "actor_rollout_ref.rollout.n",
        "actor_rollout_ref.rollout.val_kwargs.n",
        "actor_rollout_ref.rollout.response_length",
        "data.max_response_length",
        "data.max_prompt_length",
        "data.train_batch_size",
        "actor_rollout_ref.actor.ppo_mini_batch_size",
        "critic.ppo_mini_batch_size",
    ]
    specs = {spec.key: spec for spec in iter_field_specs()}
    for key in stored:
        assert specs[key].maximum is not None and specs[key].maximum <= 2**31 - 1, key
    assert specs["trainer.total_epochs"].maximum * MAX_BATCH > MAX_STEPS  # epochs x batches: see
    assert specs["data.max_response_length"].maximum == MAX_TOKENS


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("data__max_response_length", 2**20 + 1, "must be <= 1048576 (the longest prompt or"),
        ("data__train_batch_size", 2**31, "must be <= 1048576 (the most prompts or samples"),
        ("actor_rollout_ref__rollout__n", 10**9, "must be <= 1048576"),
        ("trainer__total_epochs", 10**7, "must be <= 1000000 (epochs times batches per epoch"),
        ("trainer__save_freq", 2**31, STEPS_MESSAGE),
        ("trainer__n_gpus_per_node", 10**6, "must be <= 1024 (the most processes"),
    ],
)
def test_counts_over_their_maximum_are_refused_with_the_reason(key, value, message):
    found = problems(**{key: value})
    assert found[key.replace("__", ".")].startswith(message)


def test_the_lower_bound_keeps_its_own_words():
    assert problems(data__max_prompt_length=0) == {"data.max_prompt_length": "must be > 0"}
    found = problems(actor_rollout_ref__rollout__top_p=1.5)
    assert found == {"actor_rollout_ref.rollout.top_p": "must be in (0, 1]"}


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("actor_rollout_ref.actor.optim.lr", "nan"),
        ("actor_rollout_ref.actor.optim.lr", "inf"),
        ("actor_rollout_ref.actor.clip_ratio_c", ".inf"),
        ("actor_rollout_ref.actor.entropy_coeff", "-.inf"),
        ("algorithm.kl_ctrl.kl_coef", "1e999"),
        ("critic.optim.betas", "[.nan, 0.999]"),
    ],
)
def test_nan_and_infinity_are_refused(key, value):
    config = load_config("grpo_tiny")
    set_value(config, key, value)
    with pytest.raises(ConfigValidationError) as info:
        validate_config(config, check_files=False)
    assert (key, "must be a finite number (not nan or inf)") in [
        (error.key, error.message) for error in info.value.errors
    ]


def test_integers_beyond_64_bits_and_oversized_values_are_refused():
    found = problems(trainer__seed=2**64)
    assert found["trainer.seed"] == (
        "must be between -9223372036854775807 and 9223372036854775807 (64 bits)"
    )
    found = problems(trainer__experiment_name="x" * 70_000)
    assert found["trainer.experiment_name"] == (
        "is 70,000 characters long, over the limit of 65,536; shorten it"
    )
    found = problems(actor_rollout_ref__model__override_config={"ids": list(range(10_001))})
    assert found["actor_rollout_ref.model.override_config"] == (
        "has 10,001 items, over the limit of 10,000; shorten it"
    )


def test_a_value_sharing_its_parts_is_checked_in_bounded_time():
    shared: list = ["x"]
    for _ in range(60):  # 2**60 strings if walked naively
        shared = [shared, shared]
    found = problems(actor_rollout_ref__model__override_config={"deep": shared})
    assert found["actor_rollout_ref.model.override_config"] == (
        "holds more than 100,000 values in all, the limit; shorten it"
    )


def test_a_batch_that_is_no_multiple_still_gets_its_divisor_quickly():
    found = problems(
        data__train_batch_size=2**20 - 1,
        actor_rollout_ref__actor__ppo_mini_batch_size=2**20 - 2,
        actor_rollout_ref__rollout__n=1,
        algorithm__allow_single_sample_groups=True,
    )
    assert found["actor_rollout_ref.actor.ppo_mini_batch_size"] == (
        "data.train_batch_size=1048575 is not a multiple of it; use a divisor such as 349525"
    )


@pytest.mark.parametrize("estimator", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_the_token_baseline_estimators_need_groups_and_the_old_log_prob_pass(estimator):
    assert problems(algorithm__adv_estimator=estimator) == {}
    single = problems(algorithm__adv_estimator=estimator, actor_rollout_ref__rollout__n=1)
    assert (
        f"{estimator} compares the responses to the same prompt"
        in single["actor_rollout_ref.rollout.n"]
    )
    bypass = problems(
        algorithm__adv_estimator=estimator, algorithm__rollout_correction__bypass_mode=True
    )
    assert "bypass mode skips" in bypass["algorithm.rollout_correction.bypass_mode"]
    assert "bypass mode skips" not in problems(
        algorithm__adv_estimator="grpo", algorithm__rollout_correction__bypass_mode=True
    ).get("algorithm.rollout_correction.bypass_mode", "")
