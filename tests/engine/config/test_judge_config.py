"""reward_model.judge and the keys a generative judge reads: each mistake names its key and fix."""

from __future__ import annotations

import json

import pytest

from engine.config import ConfigValidationError, load_config, validate_config


def judge_config(template="Is {response} right for {prompt}? Say yes or no.", **judge):
    cfg = load_config(
        "grpo_tiny", ["reward_model.enable=True", "reward_model.model.path=tiny://model"]
    )
    cfg.reward_model.judge.prompt_template = template
    cfg.reward_model.judge.parser = "verdict"
    for key, value in judge.items():
        setattr(cfg.reward_model.judge, key, value)
    return cfg


def problems(cfg, check_files=False):
    try:
        validate_config(cfg, check_files=check_files)
    except ConfigValidationError as exc:
        return {error.key: error.message for error in exc.errors}
    return {}


def test_a_judge_on_the_tiny_model_validates_with_its_files():
    cfg = judge_config()
    cfg.reward_model.rollout.name = "hf"
    cfg.reward_model.max_rpm = 600
    cfg.reward_model.max_tpm = 100_000
    cfg.reward_model.timeout = 60
    cfg.reward_model.estimated_tokens_per_request = 300
    assert problems(cfg, check_files=True) == {}


def test_a_template_with_an_unknown_field_names_the_fields():
    found = problems(judge_config("Grade {answer} against {ground_truth}"))
    assert found == {
        "reward_model.judge.prompt_template": "has the unknown field {answer}; the fields are "
        "{prompt}, {response}, {ground_truth}, {data_source}, and a literal brace is written "
        "twice ({{ or }})"
    }


def test_a_template_reaching_into_python_objects_is_refused():
    found = problems(judge_config("{response.__init__.__globals__}"))
    assert (
        "unknown field {response.__init__.__globals__}"
        in found["reward_model.judge.prompt_template"]
    )


def test_a_parser_that_cannot_be_built_names_the_verdicts():
    found = problems(judge_config(verdicts={"yes": "high"}))
    assert found == {
        "reward_model.judge.verdicts": "cannot build the verdict parser: the verdict mapping "
        "maps 'yes' to 'high'; a verdict's score is a number"
    }


def test_a_judge_needs_the_reward_model_enabled():
    cfg = judge_config()
    cfg.reward_model.enable = False
    assert (
        "needs reward_model.enable=True and reward_model.model.path"
        in problems(cfg)["reward_model.judge.prompt_template"]
    )


def test_the_judges_backend_is_hf_or_vllm():
    cfg = judge_config()
    cfg.reward_model.rollout.name = "sglang"
    assert problems(cfg) == {
        "reward_model.rollout.name": "serves the judge, and the judge's backends are hf, vllm "
        "(null: hf)"
    }


def test_rate_limits_without_a_judge_are_refused():
    cfg = load_config("grpo_tiny")
    cfg.reward_model.max_rpm = 60
    assert problems(cfg) == {
        "reward_model.max_rpm": "limits a generative judge's requests, but reward_model.judge."
        "prompt_template is not set; set the judge's prompt, or unset it"
    }


def test_a_judge_runs_under_the_ray_controller_without_the_reward_models_ray_role():
    cfg = judge_config()
    cfg.trainer.controller = "ray"
    assert problems(cfg) == {}
    cfg.reward_model.enable_resource_pool = True
    cfg.reward_model.model.fsdp_config.param_offload = True
    found = problems(cfg)
    for key in (
        "reward_model.enable_resource_pool",
        "reward_model.model.fsdp_config.param_offload",
    ):
        assert found[key] == (
            "places the reward model's Ray role, but a generative judge generates in the "
            f"trainer's own process (the single controller); set {key}=False"
        )


def test_a_classifier_folder_is_not_a_judge(tmp_path):
    folder = tmp_path / "rm"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"architectures": ["Qwen2ForSequenceClassification"], "num_labels": 1})
    )
    cfg = judge_config()
    cfg.reward_model.model.path = str(folder)
    message = problems(cfg, check_files=True)["reward_model.model.path"]
    assert message.startswith(f"{folder} is not a causal language model")
    assert "point it at a ...ForCausalLM folder" in message


@pytest.mark.parametrize("key", ["prompt_length", "response_length"])
def test_judge_lengths_are_bounded(key):
    cfg = judge_config()
    setattr(cfg.reward_model.rollout, key, 0)
    assert f"reward_model.rollout.{key}" in problems(cfg)
