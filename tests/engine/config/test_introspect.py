"""Field specs for the web form and dotted-key access (CPU, schema only)."""

from __future__ import annotations

import pytest

from engine.config import (
    ConfigFieldError,
    PPOConfig,
    config_to_dict,
    get_value,
    iter_field_specs,
    load_config,
    set_value,
)
from engine.config.yaml_io import yaml_load


def specs_by_key():
    return {spec.key: spec for spec in iter_field_specs()}


def test_spec_of_a_float_field():
    spec = specs_by_key()["actor_rollout_ref.actor.optim.lr"]
    assert (spec.type, spec.default, spec.group, spec.advanced) == (float, 1e-6, "actor", False)
    assert spec.help == "Learning rate."
    assert spec.choices is None
    # A section's own default wins over the field declaration.
    assert specs_by_key()["critic.optim.lr"].default == 1e-5


def test_spec_choices_types_and_groups():
    specs = specs_by_key()
    estimator = specs["algorithm.adv_estimator"]
    assert estimator.choices[:3] == ["gae", "grpo", "rloo"]
    assert (estimator.type, estimator.group, estimator.advanced) == (str, "algorithm", False)
    files = specs["data.train_files"]
    assert (files.type, files.nullable, files.item_type) == (str, True, str)
    assert specs["trainer.logger"].type is list
    assert specs["trainer.logger"].choices[:3] == ["console", "jsonl", "wandb"]
    assert specs["data.data_key_map"].type is dict
    assert specs["actor_rollout_ref.rollout.n"].group == "rollout"
    assert specs["actor_rollout_ref.model.path"].group == "model"
    assert specs["actor_rollout_ref.hybrid_engine"].group == "actor_rollout_ref"
    assert specs["critic.ppo_mini_batch_size"].nullable


def test_specs_carry_the_bounds_of_numbers():
    specs = specs_by_key()
    batch = specs["data.train_batch_size"]
    assert (batch.gt, batch.ge, batch.minimum, batch.maximum) == (0, None, 1, 2**20)
    lr = specs["actor_rollout_ref.actor.optim.lr"]
    assert (lr.gt, lr.minimum, lr.maximum) == (0, 0, None)
    top_p = specs["actor_rollout_ref.rollout.top_p"]
    assert (top_p.gt, top_p.le, top_p.maximum) == (0, 1, 1)
    gamma = specs["algorithm.gamma"]
    assert (gamma.minimum, gamma.maximum) == (0, 1)
    seed = specs["trainer.seed"]
    assert (seed.minimum, seed.maximum) == (None, None)


def test_runtime_fields_and_extras_are_not_in_the_form():
    keys = set(specs_by_key())
    assert "actor_rollout_ref.model.hf_model" not in keys
    assert "actor_rollout_ref.model.tokenizer" not in keys
    assert "extras" not in keys


def test_every_leaf_has_help_and_the_specs_cover_the_yaml():
    specs = iter_field_specs()
    assert all(spec.help for spec in specs)

    mappings = {spec.key for spec in specs if spec.type is dict}  # a dict value is one leaf

    def leaves(tree, prefix=""):
        for key, value in tree.items():
            if isinstance(value, dict) and prefix + key not in mappings:
                yield from leaves(value, f"{prefix}{key}.")
            else:
                yield prefix + key

    assert [s.key for s in specs] == list(leaves(config_to_dict(PPOConfig())))


def test_basic_fields_are_the_usual_ones():
    basic = {spec.key for spec in iter_field_specs() if not spec.advanced}
    assert 20 <= len(basic) <= 30
    for key in (
        "actor_rollout_ref.model.path",
        "data.train_files",
        "algorithm.adv_estimator",
        "actor_rollout_ref.rollout.n",
        "data.train_batch_size",
        "actor_rollout_ref.actor.optim.lr",
        "actor_rollout_ref.actor.use_kl_loss",
        "trainer.total_training_steps",
        "trainer.device",
        "trainer.n_gpus_per_node",
    ):
        assert key in basic
    assert "actor_rollout_ref.actor.policy_loss.clip_cov_lb" not in basic


def test_get_and_set_value_with_form_text():
    cfg = load_config("grpo_tiny")
    assert get_value(cfg, "actor_rollout_ref.rollout.n") == 8
    set_value(cfg, "actor_rollout_ref.rollout.n", "4")
    set_value(cfg, "actor_rollout_ref.actor.optim.lr", "1e-6")
    set_value(cfg, "actor_rollout_ref.actor.use_kl_loss", "false")
    set_value(cfg, "trainer.total_training_steps", "")
    set_value(cfg, "trainer.logger", "[console, jsonl]")
    set_value(cfg, "data.data_key_map.prompt", "question")
    set_value(cfg, "actor_rollout_ref.model.override_config.rope_theta", "10000.0")
    assert cfg.actor_rollout_ref.rollout.n == 4
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-6
    assert cfg.actor_rollout_ref.actor.use_kl_loss is False
    assert cfg.trainer.total_training_steps is None
    assert cfg.trainer.logger == ["console", "jsonl"]
    assert get_value(cfg, "data.data_key_map.prompt") == "question"
    assert cfg.actor_rollout_ref.model.override_config == {"rope_theta": 10000.0}
    model = object()
    set_value(cfg, "actor_rollout_ref.model.hf_model", model)
    assert cfg.actor_rollout_ref.model.hf_model is model


def test_get_and_set_errors():
    cfg = PPOConfig()
    with pytest.raises(ConfigFieldError, match="did you mean actor_rollout_ref.rollout.n"):
        get_value(cfg, "actor_rollout_ref.rollout.nn")
    with pytest.raises(ConfigFieldError, match="has no entry 'prompt'"):
        get_value(cfg, "data.data_key_map.prompt")
    with pytest.raises(ConfigFieldError) as info:
        set_value(cfg, "data.train_batch_size", "eight")
    assert (info.value.key, info.value.value) == ("data.train_batch_size", "eight")
    assert "expected int" in info.value.message
    assert cfg.data.train_batch_size == 1024


def test_set_value_on_a_section():
    cfg = PPOConfig()
    set_value(cfg, "algorithm.kl_ctrl", {"type": "adaptive", "target_kl": 0.05})
    assert (cfg.algorithm.kl_ctrl.type, cfg.algorithm.kl_ctrl.target_kl) == ("adaptive", 0.05)
    assert cfg.algorithm.kl_ctrl.horizon == 10000
    set_value(cfg, "reward.components", yaml_load("[{name: gsm8k, weight: 2}]"))
    assert cfg.reward.components[0].weight == 2.0
