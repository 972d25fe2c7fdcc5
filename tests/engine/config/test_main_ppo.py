"""The command line, run as a subprocess like a user would (CPU, config only)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from engine import main_ppo
from engine.config import config_from_yaml, load_config
from engine.config.yaml_io import yaml_load

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "engine.main_ppo", *args],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
    )


def test_cfg_job_prints_resolved_yaml():
    result = run_cli(
        "--config-name",
        "grpo_tiny",
        "--cfg",
        "job",
        "trainer.experiment_name=e1",
        "data.train_batch_size=16",
    )
    assert result.returncode == 0, result.stderr
    tree = yaml_load(result.stdout)
    assert tree["trainer"]["default_local_dir"] == "checkpoints/posttrain/e1"
    assert tree["actor_rollout_ref"]["rollout"]["prompt_length"] == 16
    assert tree["critic"]["enable"] is False
    expected = load_config("grpo_tiny", ["trainer.experiment_name=e1", "data.train_batch_size=16"])
    assert config_from_yaml(result.stdout).data == expected.data


def test_bad_override_exits_2_with_one_line():
    result = run_cli("--config-name=grpo_tiny", "data.max_prompt_len=3")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: data.max_prompt_len=3: unknown key")
    assert "data.max_prompt_length" in lines[0]
    assert "Traceback" not in result.stderr


def test_every_problem_of_the_command_line_is_listed_at_once_one_line_each(capsys):
    status = main_ppo.main(
        [
            "--config-name=grpo_tiny",
            "trainer.total_stepz=3",  # unknown key
            "data.trian_files=x",  # unknown key
            "bad override",  # not an override
            "actor_rollout_ref.actor.optim.lr=abc",  # wrong type
            "data.max_prompt_length=-1",  # out of bounds (a validation error)
        ]
    )
    assert status == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert [line.split("=")[0] for line in lines] == [
        "error: trainer.total_stepz",
        "error: data.trian_files",
        "error: bad override",
        "error: actor_rollout_ref.actor.optim.lr",
        "error: data.max_prompt_length",
    ]
    assert "did you mean trainer.total_epochs?" in lines[0]
    assert "did you mean data.train_files?" in lines[1]
    assert "write +key=value" in lines[1]


def test_validation_errors_one_line_each():
    result = run_cli(
        "--config-name",
        "grpo_tiny",
        "actor_rollout_ref.rollout.n=1",
        "actor_rollout_ref.rollout.name=sglang",
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2
    assert all(line.startswith("error: ") for line in lines)
    assert "SGLang needs a CUDA GPU" in result.stderr
    assert "set actor_rollout_ref.rollout.n>=2" in result.stderr


def test_wrong_type_and_missing_preset():
    result = run_cli("data.train_batch_size=abc")
    assert result.returncode == 2
    assert "error: data.train_batch_size='abc': expected int" in result.stderr
    result = run_cli("--config-name", "nope")
    assert result.returncode == 2
    assert "config 'nope' not found" in result.stderr


def test_config_path_and_extras_warning(tmp_path):
    (tmp_path / "mine.yaml").write_text("defaults: [grpo_tiny, _self_]\ntrainer:\n  seed: 5\n")
    result = run_cli(
        "--config-path", str(tmp_path), "--config-name", "mine", "--cfg", "job", "+trainer.foo=1"
    )
    assert result.returncode == 0, result.stderr
    assert yaml_load(result.stdout)["trainer"]["seed"] == 5
    assert "warning: trainer.foo is not a PostTrain config key" in result.stderr


def test_missing_trainer_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "engine.trainer", None)  # as if engine.trainer were absent
    assert main_ppo.main(["--config-name", "grpo_tiny"]) == 1
    assert "engine.trainer.run_training" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--cfg=hydra"])
def test_unknown_cfg_value_is_a_usage_error(flag):
    assert run_cli(flag).returncode == 2
