"""The optimal token baselines run end to end on the embedded tiny model (CPU): the old-log-prob
pass computes each token's sum of squared probabilities, even where the on-policy update would
skip the pass, and the estimator gets it."""

from __future__ import annotations

import math

import pytest
import torch

from engine.roles.actor import response_logits
from engine.trainer import PPOTrainer
from engine.trainer import ppo_trainer as trainer_module
from tests.engine.trainer.test_trainer import ListRecorder


@pytest.mark.parametrize("estimator", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_a_token_baseline_run_trains_on_the_policys_sum_pi_squared(
    make_config, monkeypatch, estimator
):
    config = make_config(
        "grpo_tiny",
        f"algorithm.adv_estimator={estimator}",
        "trainer.total_training_steps=3",
        "actor_rollout_ref.rollout.temperature=0.8",
    )
    trainer = PPOTrainer(config)
    assert not trainer.arr.needs_old_log_prob(config.data.train_batch_size * 4)  # on-policy
    seen: list[dict[str, float]] = []
    compute_advantage = trainer_module.compute_advantage

    def checked(batch, algorithm):
        """Check the batch the estimator receives against the policy, then estimate."""
        b = batch.batch
        mask = b["response_mask"].bool()
        with torch.no_grad():  # the policy that sampled this step, one padded forward
            logits = response_logits(trainer.arr.model, b, lean=False).double()
        pi = torch.softmax(logits / config.actor_rollout_ref.rollout.temperature, dim=-1)
        expected = (pi**2).sum(-1)
        torch.testing.assert_close(
            b["sum_pi_squared"][mask].double(), expected[mask], atol=1e-5, rtol=1e-4
        )
        advantages, returns = compute_advantage(batch, algorithm)
        seen.append({"tokens": int(mask.sum()), "spread": float(advantages[mask].std())})
        return advantages, returns

    monkeypatch.setattr(trainer_module, "compute_advantage", checked)
    recorder = ListRecorder()
    trainer.recorder = recorder
    assert trainer.fit() == "succeeded"
    assert [step for step, _ in recorder.steps] == [1, 2, 3]
    assert len(seen) == 3 and all(s["tokens"] > 0 for s in seen)
    for _, metrics in recorder.steps:
        for key in ("critic/advantages/mean", "critic/advantages/max", "critic/returns/mean"):
            assert math.isfinite(metrics[key]), key
        assert "timing_s/old_log_prob" in metrics  # the pass ran although the update is on-policy
    # Some group disagreed on its reward in some step, so the baselines gave real advantages.
    assert any(s["spread"] > 0 for s in seen)
