"""verl's DAPO example commands run here with the module renamed (engine.main_ppo).

The scripts in ``tests/third_party/verl/scripts`` are verl 0.7's own, unchanged:
``examples/gmpo_trainer/test_dapo_7b_math.sh`` and ``recipe/dapo/run_dapo_qwen2.5_32b.sh``. Each is run by bash with
``python3`` (and ``ray``) on the PATH replaced by a stub that writes down its arguments, so the
argument list is exactly what a user's shell passes, quoting included. Then the paths point at
the tiny task (the scripts' own environment variables), the sizes shrink to a CPU (same keys,
smaller numbers) and only the keys this engine refuses are overridden, each with the error it
gives, shown below.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from engine import main_ppo
from engine.config import iter_field_specs, load_config, validate_config
from engine.config.fields import NO_EFFECT, ConfigValidationError
from tests.engine.command_line import bash_arguments

SCRIPTS = Path(__file__).parents[2] / "third_party" / "verl" / "scripts"
SPECS = {spec.key: spec for spec in iter_field_specs()}
# The scripts' sizes, cut to the tiny model on a CPU (the keys are the scripts' own).
SHRINK = {
    "data.max_prompt_length": "16",
    "data.max_response_length": "8",
    "data.train_batch_size": "4",
    "data.gen_batch_size": "8",
    "actor_rollout_ref.rollout.n": "4",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "4",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": "48",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": "72",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": "72",
    "actor_rollout_ref.rollout.max_num_batched_tokens": "24",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "1",  # gen_tp: one worker here
    "+actor_rollout_ref.model.override_config.max_position_embeddings": "256",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.len": "4",
    "+reward_model.reward_kwargs.max_resp_len": "8",
    "reward_model.overlong_buffer.len": "4",
    "algorithm.filter_groups.max_num_gen_batches": "20",
    "trainer.total_training_steps": "2",
    "trainer.total_epochs": "1",
    "trainer.test_freq": "2",
    "trainer.save_freq": "2",
    "trainer.log_val_generations": "2",
}
# What this engine refuses in the scripts on one worker, overridden with the fix each error names.
REFUSED = {
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": "1",
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size": "1",
}
# The scripts split sequences over 4 or 8 GPUs (Ulysses); shrunk to one worker, that is refused.
ULYSSES = (
    "must divide the 1 ranks (trainer.nnodes x trainer.n_gpus_per_node), whose data-parallel "
    "size is ranks / it; use one of [1] (1: off) or more ranks"
)


def script_arguments(script: str, tmp_path: Path) -> list[str]:
    """Return the arguments ``script`` hands python3, with the tiny task's paths and sizes."""
    env = {
        **os.environ,
        "NNODES": "1",
        "NGPUS_PER_NODE": "1",
        "MODEL_PATH": "tiny://model",
        "TRAIN_FILE": "tiny://train.parquet",
        "TEST_FILE": "tiny://val.parquet",
        "CKPTS_DIR": str(tmp_path / "ckpts"),
    }
    return bash_arguments(SCRIPTS / script, "-m", tmp_path, env)


def shrunk(arguments: list[str], extra: dict[str, str] | None = None) -> list[str]:
    """Return ``arguments`` with the values of ``SHRINK`` (and ``extra``) put in, keys unchanged."""
    values = {**SHRINK, **(extra or {})}
    out = []
    for argument in arguments:
        key, _, value = argument.partition("=")
        out.append(f"{key}={values[key]}" if key in values else argument)
    return out


# The one warning that is not about a key: DAPO trains without a KL term on purpose.
NO_KL = "GRPO without a KL term"


def no_effect_keys(warnings: list[str]) -> list[str]:
    """Return the keys the warnings call no-effect; fail on any other warning but ``NO_KL``."""
    keys = []
    for warning in warnings:
        if warning.startswith("no effect here"):
            listed = warning.split(": ", 1)[1]
            keys += [item.split("=")[0] for item in listed.split(", ") if "=" in item]
        else:
            assert warning.startswith(NO_KL), warning
    return keys


@pytest.fixture
def offline_trackers(monkeypatch, tmp_path):
    # The scripts log to wandb: keep it on this machine.
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.mark.usefixtures("vllm_importable")  # the script's rollout is vLLM
def test_verls_dapo_7b_math_example_runs_with_the_module_renamed(tmp_path, offline_trackers):
    argv = script_arguments("verl_0_7_test_dapo_7b_math.sh", tmp_path)
    assert argv[:2] == ["-m", "verl.trainer.main_ppo"]
    arguments = shrunk(argv[2:])
    assert "reward_model.reward_manager=dapo" in arguments
    assert "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True" in arguments
    assert "actor_rollout_ref.actor.checkpoint.save_contents=['model', 'optimizer', 'extra']" in (
        arguments
    )

    # As the script stands (sizes shrunk to one worker), only its Ulysses size is refused.
    with pytest.raises(ConfigValidationError) as caught:
        validate_config(load_config("ppo_trainer", arguments), check_files=False)
    assert {e.key: e.message for e in caught.value.errors} == dict.fromkeys(REFUSED, ULYSSES)

    # The rollout is vLLM, which runs on a CPU too, but the script sizes it for a GPU: on a CPU
    # its gpu_memory_utilization is refused with what to set instead.
    with pytest.raises(ConfigValidationError) as caught:
        validate_config(
            load_config("ppo_trainer", shrunk(arguments, REFUSED) + ["trainer.device=cpu"]),
            check_files=False,
        )
    assert (
        "engine_kwargs.vllm.kv_cache_memory_bytes"
        in (
            {e.key: e.message for e in caught.value.errors}[
                "actor_rollout_ref.rollout.gpu_memory_utilization"
            ]
        )
    )

    arguments = shrunk(arguments, {**REFUSED, "actor_rollout_ref.rollout.name": "hf"})
    config = load_config("ppo_trainer", arguments)
    warnings = validate_config(config, check_files=False)
    inert = no_effect_keys(warnings)
    assert all(SPECS[key].effect == NO_EFFECT for key in inert), warnings
    assert config.actor_rollout_ref.actor.policy_loss.loss_mode == "geo_mean"
    assert config.reward_model.reward_kwargs == {
        "overlong_buffer_cfg": {"enable": True, "len": 4, "penalty_factor": 1.0, "log": False},
        "max_resp_len": 8,
    }

    assert main_ppo.main(arguments) == 0
    assert (tmp_path / "ckpts" / "global_step_2" / "actor").is_dir()


@pytest.mark.usefixtures("vllm_importable")  # the script's rollout is vLLM
def test_verls_dapo_recipe_command_runs_with_the_module_renamed(tmp_path, offline_trackers):
    argv = script_arguments("verl_0_7_run_dapo_qwen2.5_32b.sh", tmp_path)
    assert argv[:2] == ["-m", "recipe.dapo.main_dapo"]
    arguments = shrunk(argv[2:])
    for setting in (
        "algorithm.filter_groups.enable=True",
        "algorithm.filter_groups.metric=acc",
        "reward_model.overlong_buffer.enable=True",
        "data.gen_batch_size=8",
    ):
        assert setting in arguments

    # As the script stands, its Ulysses size (8, over its trainer.nnodes x 8 GPUs) is accepted.
    config = load_config("ppo_trainer", arguments)
    validate_config(config, check_files=False)
    assert config.actor_rollout_ref.actor.ulysses_sequence_parallel_size == 8

    # Run here on one CPU worker: without sequence parallelism.
    arguments = shrunk(arguments, {**REFUSED, "actor_rollout_ref.rollout.name": "hf"})
    arguments.append("trainer.total_training_steps=2")  # the script runs a whole epoch
    config = load_config("ppo_trainer", arguments)
    warnings = validate_config(config, check_files=False)
    inert = no_effect_keys(warnings)
    assert all(SPECS[key].effect == NO_EFFECT for key in inert), warnings
    fg = config.algorithm.filter_groups
    assert (fg.enable, fg.metric, fg.max_num_gen_batches) == (True, "acc", 20)
    assert config.actor_rollout_ref.actor.clip_ratio_high == 0.28

    steps = tmp_path / "steps.jsonl"
    from engine.trainer.reporting import Recorder

    class Steps(Recorder):
        def on_step(self, step, metrics):
            with steps.open("a") as f:
                f.write(json.dumps({"step": step, **metrics}) + "\n")

    from engine.trainer.run import run_training

    assert run_training(load_config("ppo_trainer", arguments), Steps()) == "succeeded"
    rows = [json.loads(line) for line in steps.read_text().splitlines()]
    trained = [row for row in rows if row["step"] > 0 and "train/num_gen_batches" in row]
    assert [row["step"] for row in trained] == [1, 2]
    for row in trained:  # 8 prompts per generation batch, groups of 4 responses
        assert row["train/num_gen_batches"] >= 1
        assert row["train/num_kept_groups"] + row["train/num_dropped_groups"] == (
            8 * row["train/num_gen_batches"]
        )
        assert row["train/num_kept_groups"] >= 4
