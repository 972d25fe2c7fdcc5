"""The calculator task as a preset: ``tiny://calculator/*`` URIs, the ``tiny_calculator`` data
source and ``grpo_tiny_calculator``, the command measured in docs/results.md.

The task takes a few CPU minutes to build, so every test but the slow one resolves the URIs
against a fake task folder (``ensure_calculator_task`` patched).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.config import config_to_dict, get_value, load_config, set_value
from engine.rewards import default_compute_score, tiny_calculator
from engine.rewards.default import KNOWN_DATA_SOURCES
from engine.roles.model_loading import resolve_path
from engine.tools import load_tools, tiny_task
from engine.tools.tiny_uris import CALCULATOR_URIS, resolve_tiny_uri, tiny_uris
from tests.engine.command_line import metric_rows, train_from_command_line
from tests.engine.tools.task_fixtures import fake_task_folder, path_keys

PRESET = "grpo_tiny_calculator"
# docs/results.md, "Tool calling on the tiny model": what the command adds to the overrides.
MEASURED = [
    "data.train_batch_size=16",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "trainer.total_training_steps=20",
    "trainer.test_freq=10",
    "data.val_max_samples=64",
    "trainer.save_freq=-1",
]
CALCULATOR_SOURCE = tiny_calculator.DATA_SOURCE
CALL = '<tool_call>{"name": "calc", "arguments": {"expr": "123+456"}}</tool_call>'


@pytest.fixture
def task(tmp_path, monkeypatch) -> SimpleNamespace:
    """Return a fake calculator task, which ``ensure_calculator_task`` now returns."""
    return fake_task_folder(
        monkeypatch,
        tmp_path / "tiny_calculator",
        tiny_task,
        "ensure_calculator_task",
        tiny_task.TOOLS_YAML,
    )


def test_calculator_uris_resolve_to_the_built_task(task, tmp_path):
    folder = task.folder
    expected = {
        "tiny://calculator/model": folder / "model",
        "tiny://calculator/train.parquet": folder / "data" / "train.parquet",
        "tiny://calculator/val.parquet": folder / "data" / "val.parquet",
        "tiny://calculator/tools.yaml": folder / "tools.yaml",
    }
    assert set(CALCULATOR_URIS) == set(expected)
    for uri, path in expected.items():
        assert resolve_tiny_uri(uri) == str(path) and Path(path).exists()
        assert resolve_path(uri) == str(path)  # what every model, data and checkpoint key reads
    assert resolve_tiny_uri("tiny://calculator/model", tmp_path / "d") == str(folder / "model")
    assert task.calls[-1] == tmp_path / "d"  # the data folder reaches ensure_calculator_task
    assert resolve_tiny_uri("/data/x.parquet") == "/data/x.parquet"
    assert set(CALCULATOR_URIS) < set(tiny_uris()) and "tiny://model" in tiny_uris()


@pytest.mark.parametrize("uri", ["tiny://calculator/nope", "tiny://calculator/", "tiny://calc"])
def test_an_unknown_uri_names_every_valid_one_and_builds_nothing(task, uri):
    with pytest.raises(ValueError, match="unknown embedded asset") as info:
        resolve_path(uri)
    assert all(known in str(info.value) for known in tiny_uris())
    assert task.calls == []


def test_the_tools_yaml_loads_from_its_uri(task):
    tools = load_tools("tiny://calculator/tools.yaml")
    assert list(tools) == [tiny_task.TOOL_NAME]
    assert tools["calc"].execute({"expr": "123+456"}, {}) == "579"


def test_every_path_the_preset_names_is_a_calculator_uri_that_resolves(task):
    config = load_config(PRESET)
    named = {key: get_value(config, key) for key in path_keys() if get_value(config, key)}
    assert named == {
        "data.train_files": "tiny://calculator/train.parquet",
        "data.val_files": "tiny://calculator/val.parquet",
        "actor_rollout_ref.model.path": "tiny://calculator/model",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path": "tiny://calculator/tools.yaml",
    }
    assert all(Path(resolve_path(v)).is_relative_to(task.folder) for v in named.values())


def test_the_preset_is_the_measured_command_with_the_reward_by_data_source(task):
    preset = load_config(PRESET)
    assert preset.custom_reward_function.path is None and not preset.reward.components
    measured = load_config("grpo_tiny", [*tiny_task.calculator_overrides(task.folder), *MEASURED])
    # The measured command named the task's scorer as a custom function; the preset reaches the
    # same function through the data-source dispatch, and names the task's files by URI.
    set_value(measured, "custom_reward_function.path", None)
    set_value(measured, "custom_reward_function.name", preset.custom_reward_function.name)
    for key in path_keys():
        value = get_value(preset, key)
        if isinstance(value, str) and value.startswith("tiny://"):
            set_value(preset, key, resolve_path(value))
    assert config_to_dict(preset) == config_to_dict(measured)


def test_the_tiny_calculator_source_is_scored_by_the_tasks_compute_score(monkeypatch):
    assert CALCULATOR_SOURCE in KNOWN_DATA_SOURCES
    answered = f"{CALL}<tool_response>579</tool_response>579"
    assert default_compute_score(CALCULATOR_SOURCE, answered, "579") == 1.0
    assert default_compute_score(CALCULATOR_SOURCE, "578", "579") == 0.0
    # A failed call: the policy's own words after it count.
    failed = f"{CALL}<tool_response>Error: bad</tool_response>579"
    assert default_compute_score(CALCULATOR_SOURCE, failed, "579") == 1.0
    seen = []

    def spy(data_source, solution_str, ground_truth, extra_info=None):
        seen.append((data_source, solution_str, ground_truth, extra_info))
        return 1

    monkeypatch.setattr(tiny_calculator, "compute_score", spy)
    score = default_compute_score(CALCULATOR_SOURCE, "x", "5", {"index": 3})
    assert score == 1.0 and type(score) is float
    assert seen == [(CALCULATOR_SOURCE, "x", "5", {"index": 3})]


def test_the_presets_reward_manager_dispatches_by_data_source():
    from engine.trainer.build import build_reward_manager

    config = load_config(PRESET)
    for validation in (False, True):
        manager = build_reward_manager(config, None, validation=validation)
        assert manager.compute_score is default_compute_score and manager.composite is None


@pytest.mark.slow
def test_one_step_of_the_preset_trains_on_the_built_task_with_the_calculator(tmp_path):
    """Build the task for real (a few CPU minutes, then cached) and run the preset for a step."""
    train_from_command_line(
        "--config-name",
        PRESET,
        "trainer.total_training_steps=1",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "data.val_max_samples=8",
        run_dir=tmp_path / "run",
        timeout=1800,
    )
    rows = metric_rows(tmp_path / "run")
    val = [r for r in rows if "val-core/tiny_calculator/reward/mean@1" in r]
    steps = [r for r in rows if "tool_call_counts/mean" in r]
    assert len(val) == 2 and len(steps) == 1  # before training and after the one step
    assert steps[0]["num_turns/max"] <= 2.0
    samples = [json.loads(line) for line in (tmp_path / "run" / "logs" / "samples.jsonl").open()]
    assert samples and all(s["data_source"] == CALCULATOR_SOURCE for s in samples)
    assert all(s["reward_error"] is None for s in samples)  # the dispatch scored every one
