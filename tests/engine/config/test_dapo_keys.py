"""DAPO's keys load under verl's spellings and are checked together, each error with its fix."""

from __future__ import annotations

import pytest

from engine.config import load_config, validate_config
from engine.config.fields import ConfigFieldError, ConfigValidationError

BUFFER = [
    "reward_model.reward_manager=dapo",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.log=False",
    "+reward_model.reward_kwargs.max_resp_len=8",
]
FILTER = ["algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=acc"]


def errors_of(*overrides: str) -> dict[str, str]:
    with pytest.raises(ConfigValidationError) as caught:
        validate_config(load_config("grpo_tiny", list(overrides)), check_files=False)
    return {e.key: e.message for e in caught.value.errors}


def test_verls_plus_overrides_land_in_reward_kwargs_as_nested_mappings():
    cfg = load_config("grpo_tiny", [*BUFFER, *FILTER, "data.gen_batch_size=96"])
    assert cfg.reward_model.reward_kwargs == {
        "overlong_buffer_cfg": {"enable": True, "len": 4, "penalty_factor": 1.0, "log": False},
        "max_resp_len": 8,
    }
    assert validate_config(cfg, check_files=False) == []
    assert cfg.algorithm.filter_groups._target_ == "verl.trainer.config.FilterGroupsConfig"
    assert cfg.data.gen_batch_size == 96


def test_a_new_reward_kwargs_entry_without_plus_says_to_add_it():
    with pytest.raises(ConfigFieldError, match=r"has no entry 'max_resp_len'; add it with \+"):
        load_config("grpo_tiny", ["reward_model.reward_kwargs.max_resp_len=8"])


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        (
            ["+reward_model.reward_kwargs.max_resp_len=8"],
            "reward_model.reward_kwargs.max_resp_len",
            "reward_manager=naive takes no arguments; set reward_model.reward_manager=dapo",
        ),
        (
            [*BUFFER[:5]],
            "reward_model.reward_kwargs.max_resp_len",
            "needs the response limit it counts back from",
        ),
        (
            ["algorithm.filter_groups.enable=True"],
            "algorithm.filter_groups.metric",
            "must be set with filter_groups.enable=True",
        ),
        (
            FILTER,
            "algorithm.filter_groups.metric",
            "acc is recorded by reward_model.reward_manager=dapo",
        ),
        (
            ["algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=pred"],
            "algorithm.filter_groups.metric",
            "another name needs a custom_reward_function",
        ),
        (
            [
                "algorithm.filter_groups.enable=True",
                "algorithm.filter_groups.metric=seq_final_reward",
                "algorithm.use_kl_in_reward=True",
            ],
            "algorithm.filter_groups.metric",
            "needs the KL penalty before filtering",
        ),
        (
            ["data.gen_batch_size=64"],
            "data.gen_batch_size",
            "is read only with algorithm.filter_groups.enable=True",
        ),
        (
            [*BUFFER[:1], *FILTER, "data.gen_batch_size=16"],
            "data.gen_batch_size",
            "must be at least data.train_batch_size=32",
        ),
        (
            [
                *BUFFER[:1],
                *FILTER,
                "actor_rollout_ref.rollout.n=1",
                "algorithm.allow_single_sample_groups=True",
            ],
            "algorithm.filter_groups.enable",
            "needs actor_rollout_ref.rollout.n >= 2",
        ),
        (
            ["reward_model.overlong_buffer.enable=True", "reward_model.overlong_buffer.len=4"],
            "reward_model.overlong_buffer.enable",
            "is read by reward_model.reward_manager=dapo",
        ),
        (
            [
                *BUFFER,
                "reward_model.overlong_buffer.enable=True",
                "reward_model.overlong_buffer.len=4",
            ],
            "reward_model.overlong_buffer.enable",
            "two spellings of one penalty",
        ),
        (
            ["reward_model.reward_manager=dapo", "reward_model.overlong_buffer.enable=True"],
            "reward_model.overlong_buffer.len",
            "must be > 0 and at most data.max_response_length=8",
        ),
    ],
)
def test_dapo_settings_that_cannot_work_are_errors_naming_the_fix(overrides, key, words):
    errors = errors_of(*overrides)
    assert key in errors, errors
    assert words in errors[key]


def test_a_buffer_past_the_longest_response_warns_that_it_never_applies():
    cfg = load_config("grpo_tiny", [*BUFFER[:5], "+reward_model.reward_kwargs.max_resp_len=12"])
    warnings = validate_config(cfg, check_files=False)
    assert any(
        "the overlong penalty starts after max_resp_len - len = 8 tokens" in w for w in warnings
    )
