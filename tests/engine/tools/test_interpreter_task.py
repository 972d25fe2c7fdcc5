"""The interpreter task: three-digit multiplication with the sandboxed ``code_interpreter``
(``engine.tools.tiny_interpreter_task`` on ``engine.tools.tool_task``); its ``tiny://interpreter/*``
URIs and the ``grpo_tiny_interpreter`` preset are in ``test_tool_task_presets``, beside the
calculator's.

The full task takes a few CPU minutes to build, so these tests build a small one (a few seeding
steps, few rows) into a temporary folder.
"""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest

from engine.rewards import default_compute_score
from engine.rewards.default import KNOWN_DATA_SOURCES
from engine.rollout.tool_calls import parse_hermes_tool_calls
from engine.tiny.cache import MANIFEST_NAME
from engine.tools import load_tools
from engine.tools.tiny_interpreter_task import INTERPRETER_TASK
from engine.tools.tool_task import build_task, tool_tokenizer

SOURCE = INTERPRETER_TASK.data_source
CALL = '<tool_call>{"name": "python", "arguments": {"code": "print(123*456)"}}</tool_call>'


@pytest.fixture(scope="module")
def small_task(tmp_path_factory) -> SimpleNamespace:
    """Build the task with 3 seeding steps on 48 train and 16 validation rows."""
    folder = tmp_path_factory.mktemp("interpreter")
    manifest = build_task(INTERPRETER_TASK, folder, train_rows=48, val_rows=16, steps=3)
    return SimpleNamespace(folder=folder, manifest=manifest)


def test_the_build_writes_the_task_and_what_the_seeding_did(small_task):
    folder, manifest = small_task.folder, small_task.manifest
    assert (folder / "model" / "config.json").is_file()
    assert json.loads((folder / MANIFEST_NAME).read_text()) == manifest
    assert manifest["task"] == "interpreter" and manifest["sft_steps"] == 3
    assert set(manifest["tool_use"]) == {
        "sampled_call_rate",
        "sampled_exact_calls",
        "greedy_exact_calls",
    }
    overrides = (folder / "overrides.txt").read_text().split()
    assert overrides == INTERPRETER_TASK.overrides(folder)
    assert f"actor_rollout_ref.model.path={folder / 'model'}" in overrides


def test_the_rows_ask_for_products_and_the_splits_share_no_pair(small_task):
    rows = {
        split: pq.read_table(small_task.folder / "data" / f"{split}.parquet").to_pylist()
        for split in ("train", "val")
    }
    assert (len(rows["train"]), len(rows["val"])) == (48, 16)
    questions = {split: {r["prompt"][0]["content"] for r in rs} for split, rs in rows.items()}
    assert not questions["train"] & questions["val"]
    for row in rows["train"] + rows["val"]:
        a, b = row["prompt"][0]["content"].rstrip("=").split("*")
        assert 100 <= int(a) <= 999 and 100 <= int(b) <= 999
        assert row["reward_model"]["ground_truth"] == str(int(a) * int(b))
        assert row["data_source"] == SOURCE


def test_the_seeded_call_runs_in_the_sandbox_and_its_output_earns_the_reward(small_task):
    call_text = INTERPRETER_TASK.call_text("123*456=")
    assert call_text == CALL
    (call,) = parse_hermes_tool_calls(call_text)
    tools = load_tools(str(small_task.folder / "tools.yaml"))
    printed = tools[call.name].execute(call.arguments, {})
    # What the seeding transcripts show as the tool's answer is what the sandbox answers.
    assert printed == INTERPRETER_TASK.reply_template.format(answer=123 * 456) == "56088\n"
    answered = f"{call_text}<tool_response>{printed}</tool_response>"
    assert default_compute_score(SOURCE, answered, "56088") == 1.0
    assert default_compute_score(SOURCE, answered.replace("56088", "56089"), "56088") == 0.0
    assert default_compute_score(SOURCE, "56088", "56088") == 1.0  # answered directly
    assert SOURCE in KNOWN_DATA_SOURCES


def test_a_seeding_transcript_learns_the_call_and_the_answer_not_the_tools_reply():
    tokenizer = tool_tokenizer()
    row = INTERPRETER_TASK.make_rows(1, 0, "train")[0]
    question, answer = row["prompt"][0]["content"], row["reward_model"]["ground_truth"]
    ids, labels = INTERPRETER_TASK.transcript(tokenizer, row, tool=True)
    learned = tokenizer.decode([i for i, lab in zip(ids, labels, strict=True) if lab != -100])
    assert learned == INTERPRETER_TASK.call_text(question) + "<eos>" + answer + "<eos>"
    text = tokenizer.decode(ids)
    assert f"<tool_response>{answer}\n</tool_response>" in text
    ids, labels = INTERPRETER_TASK.transcript(tokenizer, row, tool=False)
    assert tokenizer.decode([i for i in labels if i != -100]) == answer + "<eos>"


def test_the_cache_key_follows_the_recipe_not_the_declaring_file():
    same = dataclasses.replace(INTERPRETER_TASK)
    assert same.recipe_key() == INTERPRETER_TASK.recipe_key()
    longer = dataclasses.replace(INTERPRETER_TASK, max_response_length=256)
    assert longer.recipe_key() != INTERPRETER_TASK.recipe_key()
    with pytest.raises(ValueError, match="ToolTask.op must be one of"):
        dataclasses.replace(INTERPRETER_TASK, op="^")
