"""``PostTrainCallback`` on a real TRL ``GRPOTrainer`` run of the tiny model (the setup of
``bench/training/compare_trl.py``), reporting to a live studio: metrics with verl's names beside
TRL's, each step's completions grouped by prompt with their rewards, the config, the outcome,
and Cancel stopping training when the callback allows it."""

from __future__ import annotations

import threading
import time
from argparse import Namespace

import pytest

from webapp.runs.models import MetricPoint, Run, RunStatus, Sample
from webapp.runs.services import run_cancel

pytest.importorskip("trl")
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def grpo_trainer(tmp_path, steps: int):
    """Return TRL's GRPOTrainer on the tiny model: 8 prompts x 4 completions a step."""
    from trl import GRPOConfig, GRPOTrainer

    from bench.training.compare_arms import trl_config, trl_inputs
    from bench.training.compare_tasks import prepare_task

    args = Namespace(scale="tiny", lr=5e-5, beta=0.04, steps=steps, seed=1234)
    task, _ = prepare_task("tiny", tmp_path, threads=1)
    tokenizer, dataset, reward_fn = trl_inputs(args, task)
    return GRPOTrainer(
        model=task.model_dir,
        reward_funcs=reward_fn,
        args=GRPOConfig(**trl_config(args, tmp_path / "trl-out")),
        train_dataset=dataset,
        processing_class=tokenizer,
    )


def test_a_grpo_run_reports_its_metrics_completions_and_config(studio, token, tmp_path):
    from posttrain_client.trl import PostTrainCallback

    trainer = grpo_trainer(tmp_path, steps=3)
    PostTrainCallback.attach(trainer, url=studio.url, token=token, name="trl tiny")
    trainer.train()
    run = Run.objects.get()
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.external.source == "trl" and run.total_steps == 3
    assert run.config["num_generations"] == 4 and run.config["learning_rate"] == 5e-5
    points = {p.step: p.metrics for p in MetricPoint.objects.filter(run=run)}
    assert sorted(points) == [1, 2, 3]
    for metrics in points.values():
        assert metrics["critic/score/mean"] == metrics["reward"]
        assert metrics["response_length/mean"] == metrics["completions/mean_length"]
    for step in (1, 2, 3):
        samples = Sample.objects.filter(run=run, step=step, split="train")
        assert samples.count() == 32
        groups = {}
        for sample in samples:
            groups.setdefault(sample.prompt_index, []).append(sample.sample_index)
            assert sample.reward_parts == {"reward_fn": sample.reward}
        assert len(groups) == 8 and all(sorted(g) == [0, 1, 2, 3] for g in groups.values())
    # The mean of the stored rewards is the reward TRL logged.
    rewards = list(Sample.objects.filter(run=run, step=3).values_list("reward", flat=True))
    assert sum(rewards) / len(rewards) == pytest.approx(points[3]["reward"], abs=1e-6)


def test_cancel_in_the_studio_stops_training_when_the_callback_allows_it(studio, token, tmp_path):
    from posttrain_client.trl import PostTrainCallback

    trainer = grpo_trainer(tmp_path, steps=200)
    PostTrainCallback.attach(
        trainer, url=studio.url, token=token, allow_cancel=True, heartbeat_s=0.2
    )

    def cancel_after_the_first_step() -> None:
        deadline = time.monotonic() + 120
        while not MetricPoint.objects.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        run_cancel(run=Run.objects.get())

    canceller = threading.Thread(target=cancel_after_the_first_step)
    canceller.start()
    trainer.train()
    canceller.join()
    run = Run.objects.get()
    assert run.status == RunStatus.CANCELLED
    assert trainer.state.global_step < 200


CRASH = """
import sys
from types import SimpleNamespace
from posttrain_client.trl import PostTrainCallback

class Args(SimpleNamespace):
    def to_dict(self):
        return {"learning_rate": 1e-6}

callback = PostTrainCallback(url=sys.argv[1], token=sys.argv[2], name="crash")
args = Args(output_dir=sys.argv[3], run_name=None)
callback.on_train_begin(args, SimpleNamespace(is_world_process_zero=True, max_steps=9), None)
raise RuntimeError("CUDA error: an illegal memory access was encountered")
"""


def test_a_training_process_that_dies_ends_its_run_failed_with_the_traceback(
    studio, token, tmp_path
):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", CRASH, studio.url, token, str(tmp_path / "out")],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1 and "illegal memory access" in done.stderr
    run = Run.objects.get()
    assert run.status == RunStatus.FAILED
    assert "RuntimeError: CUDA error: an illegal memory access" in run.error
