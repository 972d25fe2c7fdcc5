"""GRPO on the tiny model with the calculator: the tool-call rate and the reward rise (CPU).

The tool use is seeded by ``engine.tools.tiny_task`` (a short supervised pass on transcripts,
30% of them tool calls); the run then learns from the task's answer reward alone
(``engine.rewards.tiny_calculator``). Measured in docs/results.md.
"""

from __future__ import annotations

import json

import pytest

from engine.tiny.cache import MANIFEST_NAME
from engine.tools.tiny_task import calculator_overrides, ensure_calculator_task
from tests.engine.command_line import metric_rows, train_from_command_line

STEPS = 20
VAL = "val-core/tiny_calculator/reward/mean@1"


def mean(rows, key):
    return sum(r[key] for r in rows) / len(rows)


@pytest.mark.slow
def test_the_seeded_model_calls_the_calculator_with_the_question():
    # What RL starts from: calls it samples, and calls that compute the asked sum. A seed that
    # calls but garbles the operands (400 steps did on one CPU: 1% exact) gives RL no right
    # answer to reinforce, and the run below fails with no sign of why.
    manifest = json.loads((ensure_calculator_task() / MANIFEST_NAME).read_text())
    rates = manifest["tool_use"]
    assert rates["greedy_exact_calls"] >= 0.8, manifest
    assert rates["sampled_call_rate"] >= 0.1 and rates["sampled_exact_calls"] >= 0.1, manifest


@pytest.mark.slow
def test_grpo_raises_the_tool_call_rate_and_the_reward(tmp_path):
    task = ensure_calculator_task()  # built once per recipe (a few CPU minutes), then cached
    train_from_command_line(
        "--config-name",
        "grpo_tiny",
        *calculator_overrides(task),
        "data.train_batch_size=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        f"trainer.total_training_steps={STEPS}",
        "trainer.test_freq=10",
        "data.val_max_samples=64",
        "trainer.save_freq=-1",
        run_dir=tmp_path / "run",
        timeout=1800,
    )
    all_rows = metric_rows(tmp_path / "run")
    rows = [r for r in all_rows if "tool_call_counts/mean" in r]
    assert len(rows) == STEPS
    val = [r[VAL] for r in all_rows if VAL in r]  # steps 0, 10 and 20
    first, last = rows[:4], rows[-4:]
    print(
        {
            k: (mean(first, k), mean(last, k))
            for k in ("tool_call_counts/mean", "critic/score/mean")
        },
        val,
    )
    assert mean(last, "tool_call_counts/mean") > mean(first, "tool_call_counts/mean") + 0.25
    assert mean(last, "critic/score/mean") > mean(first, "critic/score/mean") + 0.05
    assert len(val) == 3 and val[-1] > val[0] + 0.3  # greedy answers on held-out problems
    assert all(r["tool_error_counts/mean"] < 0.5 for r in rows)
    assert max(r["num_turns/max"] for r in rows) == 2.0
    # Each sample record keeps its turns: the call, the calculator's answer, the final answer.
    samples = (tmp_path / "run" / "logs" / "samples.jsonl").read_text().splitlines()
    tool_turns = [t for line in samples for t in json.loads(line)["turns"] if t["role"] == "tool"]
    assert any(t["name"] == "calc" and t["error"] is None for t in tool_turns)
    assert all(t["content"].startswith("Error: ") for t in tool_turns if t["error"])
