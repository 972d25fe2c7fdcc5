"""The YAML presets in engine/configs: each validates, and each algorithm preset is the command
measured in docs/results.md."""

from __future__ import annotations

import math

import pytest

from engine.config import config_to_dict, load_config, validate_config
from engine.config.loader import CONFIG_DIR
from tests.engine.command_line import metric_rows, train_from_command_line

PRESETS = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml") if p.stem != "ppo_trainer")


def test_the_algorithm_presets_are_there():
    assert {"grpo_tiny_otb", "grpo_tiny_calculator", "grpo_tiny_rm"} <= set(PRESETS)


@pytest.mark.usefixtures("vllm_importable")  # grpo_gsm8k's rollout is vLLM
@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_validates(preset):
    validate_config(load_config(preset), check_files=False)


def test_the_otb_preset_is_the_measured_command():
    measured = load_config(
        "grpo_tiny",
        ["algorithm.adv_estimator=optimal_token_baseline", "trainer.experiment_name=grpo_tiny_otb"],
    )
    assert config_to_dict(load_config("grpo_tiny_otb")) == config_to_dict(measured)


def test_the_otb_preset_trains_a_step_from_the_command_line(tmp_path):
    train_from_command_line(
        "--config-name",
        "grpo_tiny_otb",
        "trainer.total_training_steps=1",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        run_dir=tmp_path / "run",
        timeout=900,
    )
    (step,) = metric_rows(tmp_path / "run")
    # The old-log-prob pass ran for the sum of squared probabilities (the update is on-policy).
    assert "timing_s/old_log_prob" in step
    assert math.isfinite(step["critic/advantages/mean"])
