"""The policy update applies the rollout correction: the IS weights scale the loss, the current
policy's off-policy metrics are recorded, and bypass mode corrects inside its own loss."""

from __future__ import annotations

import copy

import pytest
import torch

from engine.config.algorithm import RolloutCorrectionConfig
from engine.config.schema import PPOConfig
from engine.roles.actor import PolicyActor
from tests.engine.distributed.helpers import tiny_policy, update_batch

VOCAB = 40


def setup():
    batch = update_batch(4, 4, [3, 5, 2, 4], VOCAB)
    cfg = copy.deepcopy(PPOConfig().actor_rollout_ref.actor)
    cfg.use_kl_loss, cfg.entropy_coeff, cfg.grad_clip = False, 0.0, 1e9
    model = tiny_policy(VOCAB, seed=1).double()
    batch.batch["advantages"] = batch.batch["advantages"].double()
    log_probs, _ = PolicyActor(model, cfg).compute_log_prob(
        batch, micro_batch_size=4, temperature=1.0, with_entropy=False
    )
    batch.batch["old_log_probs"] = log_probs  # on-policy: the ratio is 1, no clip bites
    batch.batch["rollout_log_probs"] = log_probs - 0.1 * batch.batch["response_mask"]
    return batch, cfg, model


def update(batch, cfg, model, correction=None):
    model = copy.deepcopy(model)
    actor = PolicyActor(model, cfg, torch.optim.SGD(model.parameters(), lr=0.0))
    return actor.update_policy(
        batch, mini_batch_size=4, micro_batch_size=2, temperature=1.0, rollout_correction=correction
    )


def test_is_weights_scale_the_policy_loss_and_the_metrics_track_the_current_policy():
    batch, cfg, model = setup()
    plain = update(batch, cfg, model)
    assert not [key for key in plain if key.startswith("rollout_corr/")]
    batch.batch["rollout_is_weights"] = torch.full_like(batch.batch["old_log_probs"], 2.0)
    weighted = update(batch, cfg, model, RolloutCorrectionConfig(rollout_is="token"))
    assert abs(plain["actor/pg_loss"]) > 1e-6
    assert weighted["actor/pg_loss"] == pytest.approx(2 * plain["actor/pg_loss"])
    # pi / pi_rollout = e^0.1 on every token: kl = E[log pi_rollout - log pi] = -0.1.
    assert weighted["rollout_corr/kl"] == pytest.approx(-0.1, abs=1e-6)


def test_bypass_mode_weighs_reinforce_by_the_current_over_the_rollout_policy():
    batch, cfg, model = setup()
    batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]  # what the trainer does
    correction = RolloutCorrectionConfig(
        rollout_is="token", rollout_is_threshold=5.0, bypass_mode=True, loss_type="reinforce"
    )
    metrics = update(batch, cfg, model, correction)
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(torch.e**0.1, abs=1e-6)
    assert metrics["rollout_corr/kl"] == pytest.approx(-0.1, abs=1e-6)
