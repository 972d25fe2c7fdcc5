"""algorithm.rollout_correction in the trainer: verl's rollout_corr/* metrics every step, the IS
weights and rejection reaching the update, and bypass mode skipping the old-log-prob pass."""

from __future__ import annotations

import pytest

from engine.trainer.run import run_training
from tests.engine.trainer.test_trainer import ListRecorder

KEY = "algorithm.rollout_correction"


def run(make_config, *overrides: str) -> list[dict[str, float]]:
    recorder = ListRecorder()
    assert run_training(make_config("grpo_tiny", *overrides), recorder) == "succeeded"
    assert [step for step, _ in recorder.steps] == [1, 2]
    return [metrics for _, metrics in recorder.steps]


def test_token_is_records_verls_metrics_every_step(make_config):
    for metrics in run(make_config, f"{KEY}.rollout_is=token"):
        # The tiny rollout samples with the very model the trainer recomputes, in fp32: the
        # ratios pi_old / pi_rollout are 1 up to float rounding.
        assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-3)
        assert metrics["rollout_corr/kl"] == pytest.approx(0.0, abs=1e-4)
        assert metrics["rollout_corr/rollout_is_veto_fraction"] == 0.0
        assert "rollout_corr/chi2_seq" in metrics and "rollout_corr/training_ppl" in metrics
        assert "timing_s/old_log_prob" in metrics  # decoupled: recomputed though on-policy


def test_without_correction_nothing_is_recorded_or_recomputed(make_config):
    for metrics in run(make_config):
        assert not [key for key in metrics if key.startswith("rollout_corr/")]
        assert "timing_s/old_log_prob" not in metrics  # on-policy: the pass is skipped


def test_bypass_mode_skips_the_old_log_prob_pass_and_corrects_in_the_loss(make_config):
    steps = run(
        make_config,
        f"{KEY}.bypass_mode=True",
        f"{KEY}.loss_type=reinforce",
        f"{KEY}.rollout_is=token",
        f"{KEY}.rollout_rs=token",
        f"{KEY}.rollout_rs_threshold=1.01",
        # Two mini-batches: the second one's policy has moved, so pi / pi_rollout != 1; the
        # trainer would recompute old log-probs for it, and calculate_log_probs asks for them.
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
    )
    for metrics in steps:
        assert "timing_s/old_log_prob" not in metrics
        assert "training/rollout_probs_diff_mean" not in metrics
        assert "rollout_corr/rollout_is_mean" in metrics
    # The weights of the second mini-batch move off 1 and the tight rejection bites.
    assert any(m["rollout_corr/rollout_is_max"] > 1.01 for m in steps)
    assert any(m["rollout_corr/rollout_rs_masked_fraction"] > 0 for m in steps)
    assert any(m["rollout_corr/kl"] != 0 for m in steps)
