"""``actor_rollout_ref.rollout.calculate_log_probs``: verl's rollout-vs-actor probability check."""

from __future__ import annotations

import math

import pytest
import torch

from engine.trainer.metrics import compute_rollout_probs_diff_metrics
from engine.trainer.run import run_training
from tests.engine.trainer.test_trainer import ListRecorder

DIFF_KEYS = (
    "training/rollout_probs_diff_max",
    "training/rollout_probs_diff_mean",
    "training/rollout_probs_diff_std",
)


def test_probs_diff_by_hand():
    rollout = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.4, 0.3, 0.1]]))
    actor = torch.log(torch.tensor([[0.6, 0.2, 0.1], [0.1, 0.3, 0.7]]))
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])  # the masked 0.9 vs 0.1 must not count
    metrics = compute_rollout_probs_diff_metrics(rollout, actor, mask)
    diffs = torch.tensor([0.1, 0.0, 0.3, 0.0, 0.6])
    assert metrics["training/rollout_probs_diff_max"] == pytest.approx(0.6)
    assert metrics["training/rollout_probs_diff_mean"] == pytest.approx(0.2)
    assert metrics["training/rollout_probs_diff_std"] == pytest.approx(diffs.std().item())
    assert metrics["training/rollout_probs_diff_valid"] == 1.0
    a, r = [0.6, 0.2, 0.1, 0.3, 0.7], [0.5, 0.2, 0.4, 0.3, 0.1]
    assert metrics["training/rollout_actor_probs_pearson_corr"] == pytest.approx(
        torch.corrcoef(torch.tensor([a, r]))[0, 1].item(), abs=1e-6
    )


@pytest.mark.parametrize("calculate", [True, False])
def test_calculate_log_probs_records_the_diff_every_step(make_config, calculate):
    config = make_config("grpo_tiny", f"actor_rollout_ref.rollout.calculate_log_probs={calculate}")
    recorder = ListRecorder()
    assert run_training(config, recorder) == "succeeded"
    assert [step for step, _ in recorder.steps] == [1, 2]
    for _, metrics in recorder.steps:
        if not calculate:
            assert not [k for k in metrics if k.startswith("training/rollout_")]
            continue
        # The tiny model samples and recomputes in fp32 on the CPU: the probabilities agree.
        assert all(math.isfinite(metrics[k]) for k in DIFF_KEYS)
        assert 0.0 <= metrics["training/rollout_probs_diff_mean"] <= 1e-4
        assert metrics["training/rollout_probs_diff_max"] <= 1e-3
        assert "timing_s/old_log_prob" in metrics  # recomputed even though the step is on-policy
