"""The calculator task as a preset: its tools YAML by URI, the ``tiny_calculator`` data source and
``grpo_tiny_calculator`` (its URIs and its match with the measured command are in
``test_tool_task_presets``, beside the interpreter's).

The task takes a few CPU minutes to build, so every test but the slow one resolves the URIs
against a fake task folder (``ensure_calculator_task`` patched).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from engine.config import load_config
from engine.rewards import default_compute_score, tiny_calculator
from engine.rewards.default import KNOWN_DATA_SOURCES
from engine.tools import load_tools, tiny_task
from tests.engine.command_line import metric_rows, train_from_command_line
from tests.engine.tools.task_fixtures import fake_task_folder

PRESET = "grpo_tiny_calculator"
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


def test_the_tools_yaml_loads_from_its_uri(task):
    tools = load_tools("tiny://calculator/tools.yaml")
    assert list(tools) == [tiny_task.TOOL_NAME]
    assert tools["calc"].execute({"expr": "123+456"}, {}) == "579"


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
