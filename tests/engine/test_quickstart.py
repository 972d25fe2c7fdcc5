"""The quick starts users copy from verl tutorials run with ``verl`` renamed to ``engine``.

The two snippets are kept here as a tutorial prints them (``docs/quickstart.md`` shows the same
text, checked below); the only edits are the model path (the embedded ``tiny://model``) and the
rollout backend (``hf`` on a CPU). The alias table behind them (``engine.config.aliases``) is
tested key by key.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from engine.config import ConfigFieldError, ConfigValidationError, load_config, validate_config
from engine.config.aliases import ALIASES, apply_aliases
from engine.utils.config import load_config_from_yaml
from tests.engine.command_line import run_python_code

ROOT = Path(__file__).resolve().parents[2]

PYTHON_SNIPPET = """\
import engine; print(engine.__version__)
from engine.trainer import PPOTrainer
from engine.data import RLDataLoader
from engine.utils.config import load_config_from_yaml
from engine.utils.device import get_device_info
info = get_device_info()
print(info["num_gpus"], info["max_memory_mb"], info["nccl_available"])

config = load_config_from_yaml("configs/ppo_gsm8k.yaml")
config.data.train_dataset_path = "./gsm8k_mini.jsonl"   # {"question": ..., "answer": "10"} per line
config.actor_rollout_ref.model.path = "Qwen/Qwen2-0.5B-Instruct"   # tiny://model here
config.data.train_batch_size = 8
config.trainer.total_steps = 200
trainer = PPOTrainer(config)
trainer.train()
"""

YAML_SNIPPET = """\
# configs/ppo_gsm8k.yaml
algorithm: {name: ppo, kl_coeff: 0.1, clip_range: 0.2}
data:
  train_dataset_path: ""
  data_key_map: {prompt: "question", answer: "answer"}
  train_batch_size: 16
  max_prompt_length: 512
  max_response_length: 256
actor_rollout_ref:
  model: {path: "", dtype: "bfloat16"}
  rollout: {name: "sglang", gpu_memory_utilization: 0.85, multi_turn: {enable: true, max_assistant_turns: 3}}
reward_model: {name: rule_based, config: {task: "gsm8k"}}
# or: reward_model: {name: "custom_reward", config: {module_path: "my_reward.my_reward_fn"}}
trainer: {total_steps: 1000, log_interval: 10, save_interval: 100}
"""

# The five-line data file: {"question": ..., "answer": "10"} per line.
GSM8K_MINI = [("3+7=", "10"), ("12+5=", "17"), ("40+2=", "42"), ("8+8=", "16"), ("21+30=", "51")]


def write_quickstart(folder: Path, yaml_text: str = YAML_SNIPPET) -> None:
    """Lay out the tutorial's files: the YAML (rollout on hf here) and the five-line JSONL."""
    (folder / "configs").mkdir(parents=True, exist_ok=True)
    (folder / "configs" / "ppo_gsm8k.yaml").write_text(
        yaml_text.replace('name: "sglang"', 'name: "hf"')
    )
    lines = [f'{{"question": "{q}", "answer": "{a}"}}' for q, a in GSM8K_MINI]
    (folder / "gsm8k_mini.jsonl").write_text("\n".join(lines) + "\n")


def test_the_docs_show_the_snippets_this_test_runs():
    text = (ROOT / "docs" / "quickstart.md").read_text()
    assert PYTHON_SNIPPET in text
    assert YAML_SNIPPET in text


@pytest.mark.slow
def test_the_python_quick_start_trains_as_written(tmp_path):
    write_quickstart(tmp_path)
    script = PYTHON_SNIPPET.replace('"Qwen/Qwen2-0.5B-Instruct"', '"tiny://model"')
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = run_python_code(script, cwd=tmp_path, env=env, timeout=600)
    lines = proc.stdout.splitlines()
    assert lines[0] == __import__("engine").__version__
    assert lines[1].split()[0] == "0" and lines[1].split()[2] in ("True", "False")
    assert "step 200/200" in proc.stdout and "run succeeded" in proc.stdout
    # log_interval 10 is the console's cadence: steps 10, 20, ... 200 are printed, not step 7.
    assert "step 10/200" in proc.stdout and "step 7/200" not in proc.stdout
    # save_interval 100 is save_freq: checkpoints at 100 and 200 in verl's default folder.
    checkpoints = tmp_path / "checkpoints" / "posttrain" / "default"
    assert {p.name for p in checkpoints.glob("global_step_*")} == {
        "global_step_100",
        "global_step_200",
    }
    # Each tutorial spelling is named once, with its verl key.
    for key in (
        "algorithm.name",
        "algorithm.kl_coeff",
        "algorithm.clip_range",
        "data.train_dataset_path",
        "data.data_key_map.answer",
        "actor_rollout_ref.model.dtype",
        "trainer.total_steps",
        "trainer.log_interval",
        "trainer.save_interval",
        "reward_model.name",
    ):
        assert proc.stderr.count(f"note: {key} is not a verl key") == 1, key
    assert "every batch repeats prompts" in proc.stderr  # 5 rows, batches of 8
    assert "one assistant turn" in proc.stdout  # multi_turn.enable with no interaction


def test_the_yaml_means_what_verl_would_run(tmp_path):
    write_quickstart(tmp_path)
    config = load_config_from_yaml(tmp_path / "configs" / "ppo_gsm8k.yaml")
    assert config.algorithm.adv_estimator == "gae" and config.critic.enable is True
    assert config.algorithm.kl_ctrl.kl_coef == 0.1 and config.algorithm.use_kl_in_reward
    assert config.actor_rollout_ref.actor.clip_ratio == 0.2
    assert config.data.data_key_map == {"prompt": "question", "ground_truth": "answer"}
    assert config.actor_rollout_ref.rollout.dtype == "bfloat16"
    assert config.trainer.total_training_steps == 1000
    assert (config.trainer.log_freq, config.trainer.save_freq) == (10, 100)
    assert [c.name for c in config.reward.components] == ["gsm8k"]
    config.data.train_dataset_path = str(tmp_path / "gsm8k_mini.jsonl")
    assert config.data.train_files == str(tmp_path / "gsm8k_mini.jsonl")


def test_the_custom_reward_alternative_names_the_module_file(tmp_path, monkeypatch):
    alternative = YAML_SNIPPET.replace(
        'reward_model: {name: rule_based, config: {task: "gsm8k"}}\n# or: ', ""
    )
    write_quickstart(tmp_path, alternative)
    (tmp_path / "my_reward.py").write_text(
        "def my_reward_fn(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(solution_str.strip() == ground_truth)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    config = load_config_from_yaml("configs/ppo_gsm8k.yaml")
    assert Path(config.custom_reward_function.path) == tmp_path / "my_reward.py"
    assert config.custom_reward_function.name == "my_reward_fn"
    assert config.reward.components == []


def test_an_alias_and_its_verl_key_set_to_different_values_is_an_error_naming_both(tmp_path):
    path = tmp_path / "both.yaml"
    path.write_text("trainer: {total_steps: 5, total_training_steps: 6}\n")
    with pytest.raises(ConfigFieldError) as info:
        load_config(str(path))
    message = str(info.value)
    assert "trainer.total_steps" in message and "trainer.total_training_steps=6" in message
    path.write_text("trainer: {total_steps: 6, total_training_steps: 6}\n")  # agreeing is fine
    assert load_config(str(path)).trainer.total_training_steps == 6
    with pytest.raises(ConfigFieldError, match="algorithm.name.*critic.enable=False"):
        apply_aliases({"algorithm": {"name": "ppo"}, "critic": {"enable": False}})


def test_on_the_command_line_an_alias_overrides_a_preset_like_its_verl_key():
    config = load_config(
        "grpo_tiny",
        [
            "trainer.total_steps=7",
            "algorithm.name=rloo",
            "algorithm.clip_range=0.3",
            "reward_model.name=rule_based",
            "+reward_model.config.task=gsm8k",
        ],
    )
    assert config.trainer.total_training_steps == 7  # the preset says 150
    assert config.algorithm.adv_estimator == "rloo"
    assert config.actor_rollout_ref.actor.clip_ratio == 0.3
    assert [c.name for c in config.reward.components] == ["gsm8k"]


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("algorithm.name", "grpo", {"algorithm.adv_estimator": "grpo"}),
        ("algorithm.name", "PPO", {"algorithm.adv_estimator": "gae", "critic.enable": True}),
        ("actor_rollout_ref.model.dtype", "fp16", {"actor_rollout_ref.rollout.dtype": "float16"}),
        (  # verl's CISPO example script's spelling
            "actor_rollout_ref.model.torch_dtype",
            "bfloat16",
            {"actor_rollout_ref.rollout.dtype": "bfloat16"},
        ),
        ("data.val_dataset_path", "v.jsonl", {"data.val_files": "v.jsonl"}),
        ("trainer.save_interval", 5, {"trainer.save_freq": 5}),
    ],
)
def test_each_alias_translates_to_its_verl_keys(key, value, expected):
    from engine.config import get_value

    config = load_config("grpo_tiny", [f"{key}={value}"])
    assert {k: get_value(config, k) for k in expected} == expected
    assert set(expected) <= set(ALIASES[key].targets)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algorithm.name=sac", "not an algorithm; use ppo .*grpo"),
        ("actor_rollout_ref.model.dtype=int4", "not a dtype; use one of bfloat16"),
        ("reward_model.name=sparkle", "not a reward; use one of rule_based, custom_reward"),
    ],
)
def test_an_alias_value_with_no_verl_meaning_is_refused_with_the_choices(override, message):
    with pytest.raises(ConfigFieldError, match=message):
        load_config("grpo_tiny", [override])


def test_a_rule_based_reward_needs_a_known_task_and_a_module_path_a_file(tmp_path, monkeypatch):
    with pytest.raises(ConfigFieldError, match="a rule_based reward needs a task, one of"):
        apply_aliases({"reward_model": {"name": "rule_based", "config": {"task": "chess"}}})
    monkeypatch.chdir(tmp_path)
    bad = {"reward_model": {"name": "custom_reward", "config": {"module_path": "nowhere.fn"}}}
    with pytest.raises(ConfigFieldError, match="no Python file for module 'nowhere'"):
        apply_aliases(bad)
    with pytest.raises(ConfigFieldError, match="write module.function"):
        apply_aliases({"reward_model": {"name": "custom_reward", "config": {"module_path": "x"}}})


def test_config_sections_refuse_attributes_that_are_not_keys():
    config = load_config("grpo_tiny")
    config.trainer.total_steps = 12  # a tutorial spelling inside its section: a property
    assert config.trainer.total_training_steps == 12 and config.trainer.total_steps == 12
    with pytest.raises(AttributeError, match="TrainerConfig has no key 'total_training_step'"):
        config.trainer.total_training_step = 3  # a typo, not kept and ignored
    with pytest.raises(AttributeError, match="set config.actor_rollout_ref.actor.clip_ratio"):
        config.algorithm.clip_range = 0.1  # its verl key lives in another section


def test_an_unsupported_rollout_backend_is_refused_naming_the_supported_ones():
    config = load_config("grpo_tiny", ["actor_rollout_ref.rollout.name=lightllm"])
    with pytest.raises(ConfigValidationError, match="rollout.name='lightllm': must be one of hf"):
        validate_config(config)


def test_the_tutorial_names_exist():
    import engine
    from engine.data import PromptDataLoader, RLDataLoader
    from engine.device_info import device_info
    from engine.utils.device import get_device_info

    assert engine.__version__ == __import__("importlib.metadata").metadata.version(
        "posttrain-studio"
    )
    assert RLDataLoader is PromptDataLoader
    info = get_device_info()
    assert {"num_gpus", "max_memory_mb", "nccl_available"} <= set(info)
    assert set(device_info(check_vllm=False)) <= set(info)
    assert info["num_gpus"] == info["gpu_count"]


def test_multi_turn_with_no_interaction_is_one_assistant_turn(capsys):
    from types import SimpleNamespace

    from engine.roles.actor_rollout_ref import get_rollout
    from engine.rollout.hf import HFRollout
    from engine.tiny.tokenizer import build_tokenizer
    from tests.engine.distributed.helpers import tiny_policy

    tokenizer = build_tokenizer()
    multi_turn = SimpleNamespace(enable=True, interaction_path=None, interaction_name=None)
    rollout = get_rollout(
        "hf", tiny_policy(len(tokenizer)), tokenizer, SimpleNamespace(multi_turn=multi_turn)
    )
    assert type(rollout) is HFRollout
    assert "every conversation is the prompt and one assistant turn" in capsys.readouterr().out
    multi_turn.interaction_name = "chat"  # half an interaction is still an error
    with pytest.raises(ValueError, match="needs .*interaction_path"):
        get_rollout(
            "hf", tiny_policy(len(tokenizer)), tokenizer, SimpleNamespace(multi_turn=multi_turn)
        )
