"""``trainer.val_only`` and ``trainer.log_val_generations`` on the embedded tiny model (CPU)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine.main_ppo import main
from engine.trainer import PPOTrainer
from engine.trainer.checkpoint import saved_steps
from engine.trainer.reporting import SampleRecord
from engine.trainer.run import run_training
from engine.trainer.validation import pick_val_generations
from tests.engine.trainer.test_trainer import ListRecorder

VAL_KEY = "val-core/tiny_arithmetic/reward/mean@1"


def test_val_only_validates_records_step_zero_and_stops_without_training(make_config, tmp_path):
    config = make_config("grpo_tiny", "trainer.val_only=True", "trainer.save_freq=1")
    trainer = PPOTrainer(config)
    before = {k: v.clone() for k, v in trainer.arr.model.state_dict().items()}
    recorder = ListRecorder()
    trainer.recorder = recorder
    assert trainer.fit() == "succeeded"
    # The metrics of a normal validation, at step 0, and nothing else.
    ((step, metrics),) = recorder.steps
    assert step == 0 and VAL_KEY in metrics
    assert not [k for k in metrics if k.startswith(("actor/", "critic/", "timing_s/"))]
    assert recorder.samples and {s.split for s in recorder.samples} == {"val"}
    assert recorder.finished == ["succeeded"] and not recorder.checkpoints
    assert saved_steps(tmp_path / "ckpt") == []
    after = trainer.arr.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_val_only_validates_at_the_resumed_step(make_config):
    common = ("trainer.total_training_steps=1", "trainer.save_freq=1")
    assert run_training(make_config("grpo_tiny", *common)) == "succeeded"
    recorder = ListRecorder()
    config = make_config("grpo_tiny", *common, "trainer.val_only=True")
    assert run_training(config, recorder) == "succeeded"
    ((step, metrics),) = recorder.steps
    assert step == 1 and VAL_KEY in metrics
    assert {s.step for s in recorder.samples} == {1}


def test_val_only_from_the_command_line_exits_zero_with_the_metrics(tiny_assets, tmp_path):
    status = main(
        [
            "--config-name",
            "grpo_tiny",
            "trainer.val_only=True",
            "trainer.save_freq=1",
            "trainer.logger=[jsonl]",
            f"trainer.default_local_dir={tmp_path}",
        ]
    )
    assert status == 0
    rows = [
        json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows] == [0] and VAL_KEY in rows[0]
    assert saved_steps(tmp_path) == []


def test_val_only_without_validation_data_is_refused(make_config):
    config = make_config("grpo_tiny", "trainer.val_only=True", "data.val_files=null")
    with pytest.raises(ValueError, match="trainer.val_only=True .* data.val_files is not set"):
        PPOTrainer(config)


def record(prompt: str, response: str, reward: float) -> SampleRecord:
    return SampleRecord(
        step=0,
        split="val",
        prompt_index=0,
        sample_index=0,
        group_id="g",
        data_source="d",
        prompt_text=prompt,
        response_text=response,
        ground_truth=None,
        reward=reward,
    )


def test_pick_val_generations_is_verls_sort_shuffle_with_seed_42():
    records = [record(f"p{i:02d}", f"r{i}", float(i)) for i in (7, 3, 11, 0, 5, 9, 1, 4)]
    # verl's _maybe_log_val_generations on the (input, output, score) tuples.
    samples = sorted((r.prompt_text, r.response_text, r.reward) for r in records)
    np.random.RandomState(42).shuffle(samples)
    picked = pick_val_generations(records, 3)
    assert [(r.prompt_text, r.response_text, r.reward) for r in picked] == samples[:3]
    assert pick_val_generations(list(reversed(records)), 3) == picked  # input order is irrelevant
    assert pick_val_generations(records, 0) == []
    assert len(pick_val_generations(records, 100)) == len(records)


def test_log_val_generations_bounds_what_the_loggers_get(make_config, tmp_path, capsys):
    config = make_config(
        "grpo_tiny",
        "trainer.val_only=True",
        "trainer.log_val_generations=3",
        "trainer.logger=[console,jsonl]",
    )
    recorder = ListRecorder()
    assert run_training(config, recorder) == "succeeded"
    # The caller's recorder (the studio's) keeps every validation sample ...
    assert len(recorder.samples) == 200
    # ... trainer.logger's sinks get the three verl picks: a console table and three jsonl rows.
    picked = pick_val_generations(recorder.samples, 3)
    out = capsys.readouterr().out
    assert "validation generations at step 0 (3):" in out
    table = out.split("validation generations at step 0 (3):")[1].splitlines()[2:5]
    assert [line.split(" | ")[0].strip() for line in table] == [f"{s.reward:.2f}" for s in picked]
    assert [line.split(" | ")[2] for line in table] == [s.response_text for s in picked]
    lines = (tmp_path / "ckpt" / "logs" / "samples.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [(r["prompt_text"], r["response_text"]) for r in rows] == [
        (s.prompt_text, s.response_text) for s in picked
    ]


def test_log_val_generations_zero_logs_none(make_config, tmp_path, capsys):
    config = make_config("grpo_tiny", "trainer.val_only=True", "trainer.logger=[console,jsonl]")
    recorder = ListRecorder()
    assert run_training(config, recorder) == "succeeded"
    assert len(recorder.samples) == 200
    assert "validation generations" not in capsys.readouterr().out
    assert not (tmp_path / "ckpt" / "logs" / "samples.jsonl").exists()
