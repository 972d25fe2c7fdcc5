"""``python -m engine.eval``, the validation metrics, and the Python API with a live model."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import engine
from engine.eval import evaluate
from engine.trainer.metrics import compute_validation_metrics


def test_greedy_accuracy_matches_the_recipe_measurement(tiny_assets):
    result = evaluate(
        str(tiny_assets.model_dir),
        [str(tiny_assets.val_parquet)],
        max_prompt_length=16,
        max_response_length=8,
    )
    assert result["num_prompts"] == 200
    # The recipe measured the same greedy accuracy on the same 200 problems when it was built.
    assert result["greedy_accuracy"] == pytest.approx(
        tiny_assets.manifest["val_accuracy"], abs=0.01
    )
    assert result["greedy"]["val-core/tiny_arithmetic/reward/mean@1"] == result["greedy_accuracy"]


def test_sampled_pass_reports_mean_and_best_of_n(tiny_assets):
    result = evaluate(
        "tiny://model",
        ["tiny://val.jsonl"],
        n=4,
        max_prompt_length=16,
        max_response_length=8,
        data_key_map={"prompt": "question", "ground_truth": "answer"},
    )
    sampled = result["sampled"]
    mean, best = (
        sampled["val-core/tiny_arithmetic/reward/mean@4"],
        sampled["val-core/tiny_arithmetic/reward/best@4/mean"],
    )
    assert 0.0 <= mean <= best <= 1.0
    assert best > mean  # four tries find answers one sample misses


def test_eval_cli_reports_a_missing_model_in_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "engine.eval", "--model", str(tmp_path), "--data", "x.parquet"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "neither a Hugging Face folder nor a checkpoint" in result.stderr
    assert "Traceback" not in result.stderr


def test_validation_metrics_by_hand():
    sources = ["a"] * 4 + ["b"] * 2
    uids = ["p1", "p1", "p2", "p2", "q1", "q1"]
    scores = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    preds = ["7", "8", "3", "3", "5", "5"]
    metrics = compute_validation_metrics(sources, uids, scores, preds)
    assert metrics["val-core/a/reward/mean@2"] == pytest.approx(0.25)
    # best/worst/maj of 2 are verl's bootstraps (1000 draws of 2 with replacement): p1's best
    # is 1 with probability 3/4, its worst with 1/4; p2 scores 0 throughout.
    assert metrics["val-core/a/reward/best@2/mean"] == pytest.approx(0.75 / 2, abs=0.03)
    assert metrics["val-aux/a/reward/worst@2/mean"] == pytest.approx(0.25 / 2, abs=0.03)
    # p1's draws tie 1:1 unless both pick one answer; the first vote wins, "7" (correct) half
    # the time. p2's majority "3" is wrong.
    assert metrics["val-core/a/reward/maj@2/mean"] == pytest.approx(0.5 / 2, abs=0.03)
    assert metrics["val-core/b/reward/mean@2"] == pytest.approx(1.0)


def test_python_api_trains_a_model_handed_in(tiny_assets, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_assets.model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets.model_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    config = engine.load_config(
        "grpo_tiny.yaml",
        overrides=[
            "trainer.total_training_steps=1",
            "trainer.val_before_train=False",
            "trainer.test_freq=-1",
            "trainer.logger=[]",
            f"trainer.default_local_dir={tmp_path}",
        ],
    )
    config.data.train_batch_size = 4
    config.actor_rollout_ref.actor.ppo_mini_batch_size = 4
    config.actor_rollout_ref.model.hf_model = model
    config.actor_rollout_ref.model.tokenizer = tokenizer
    trainer = engine.PPOTrainer(config)
    assert trainer.arr.model is model  # trained in place, not reloaded from the path
    assert trainer.train() == "succeeded"
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
