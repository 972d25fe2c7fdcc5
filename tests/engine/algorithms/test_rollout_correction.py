"""Rollout correction (verl's rollout_corr_helper) on small hand-computed tensors."""

from __future__ import annotations

import math

import pytest
import torch

from engine.algorithms.policy_loss.base import PolicyLossInputs, get_policy_loss_fn
from engine.algorithms.policy_loss.bypass_mode import (
    compute_policy_loss_bypass_mode,
    compute_policy_loss_reinforce,
)
from engine.algorithms.rollout_correction import (
    compute_offpolicy_metrics,
    compute_rollout_correction_and_rejection_mask,
    compute_rollout_correction_weights,
    compute_rollout_rejection_mask,
    correction_settings,
)
from engine.config.actor import ActorConfig, PolicyLossConfig
from engine.config.algorithm import RolloutCorrectionConfig

# Ratios pi_old / pi_rollout; the last token of row 1 is padding (its 0.1 must never count).
RATIOS = torch.tensor([[2.0, 0.5, 4.0], [1.0, 3.0, 0.1]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
LOG_RATIO = torch.log(RATIOS)


def test_token_is_weights_are_truncated_ratios_and_zero_on_padding():
    weights, m = compute_rollout_correction_weights(LOG_RATIO, MASK, "token", 2.0)
    assert torch.allclose(weights, torch.tensor([[2.0, 0.5, 2.0], [1.0, 2.0, 0.0]]))
    assert not weights.requires_grad
    # Metrics describe the weights before truncation: 2, 0.5, 4, 1, 3.
    assert m["rollout_is_mean"] == pytest.approx(10.5 / 5)
    assert m["rollout_is_max"] == pytest.approx(4.0)
    assert m["rollout_is_min"] == pytest.approx(0.5)
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(2 / 5)  # 4 and 3 exceed 2
    assert m["rollout_is_ratio_fraction_low"] == 0.0  # 0.5 is not under 1/2
    assert m["rollout_is_seq_mean"] == pytest.approx((6.5 / 3 + 4.0 / 2) / 2)
    assert m["rollout_is_seq_max_deviation"] == pytest.approx(6.5 / 3 - 1)
    assert m["rollout_is_seq_fraction_high"] == pytest.approx(0.5)  # 2.17 > 2, 2.0 is not
    # std and ESS use the weights clamped to [1/2, 2]: 2, 0.5, 2, 1, 2.
    clamped = torch.tensor([2.0, 0.5, 2.0, 1.0, 2.0])
    mean = clamped.mean()
    assert m["rollout_is_std"] == pytest.approx(math.sqrt((clamped**2).mean() - mean**2), 1e-5)
    ess = 1 / ((clamped / (mean + 1e-8)) ** 2).mean()
    assert m["rollout_is_eff_sample_size"] == pytest.approx(ess.item(), 1e-5)
    assert "rollout_is_batch_norm_factor" not in m


def test_sequence_is_weight_is_the_truncated_product_of_the_row():
    ratios = torch.tensor([[2.0, 0.25, 0.5], [1.0, 3.0, 7.0]])
    weights, m = compute_rollout_correction_weights(torch.log(ratios), MASK, "sequence", 2.0)
    # Row 0: 2 * 0.25 * 0.5 = 0.25; row 1: 1 * 3 = 3, truncated to 2 (the padded 7 is not in it).
    assert torch.allclose(weights, torch.tensor([[0.25] * 3, [2.0, 2.0, 0.0]]))
    assert m["rollout_is_max"] == pytest.approx(3.0)
    assert m["rollout_is_min"] == pytest.approx(0.25)
    assert m["rollout_is_ratio_fraction_high"] == 0.5
    assert m["rollout_is_ratio_fraction_low"] == 0.5


@pytest.mark.parametrize(
    ("level", "factor"),
    [("token", 7.5 / 5), ("sequence", (0.25 + 2.0) / 2)],
)
def test_batch_normalisation_divides_the_truncated_weights_by_their_mean(level, factor):
    ratios = RATIOS if level == "token" else torch.tensor([[2.0, 0.25, 0.5], [1.0, 3.0, 7.0]])
    raw, _ = compute_rollout_correction_weights(torch.log(ratios), MASK, level, 2.0)
    weights, m = compute_rollout_correction_weights(torch.log(ratios), MASK, level, 2.0, True)
    assert m["rollout_is_batch_norm_factor"] == pytest.approx(factor)
    assert torch.allclose(weights, raw / factor)


def test_token_rejection_masks_tokens_outside_the_thresholds():
    mask, m = compute_rollout_rejection_mask(LOG_RATIO, MASK, "token", 2.5)  # lower: 1/2.5
    assert torch.equal(mask, torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))
    assert m["rollout_rs_masked_fraction"] == pytest.approx(2 / 5)  # 4 and 3
    assert m["rollout_rs_seq_masked_fraction"] == 1.0  # each row lost a token
    assert m["rollout_rs_max"] == pytest.approx(4.0)
    mask, _ = compute_rollout_rejection_mask(LOG_RATIO, MASK, "token", 5.0, 0.9)
    assert torch.equal(mask, torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]))  # 0.5 < 0.9


def test_sequence_rejection_masks_whole_rows_by_the_product():
    # Products: row 0 2 * 0.5 * 4 = 4, row 1 1 * 3 = 3.
    mask, m = compute_rollout_rejection_mask(LOG_RATIO, MASK, "sequence", 3.5)
    assert torch.equal(mask, torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]))
    assert m["rollout_rs_seq_masked_fraction"] == 0.5
    assert m["rollout_rs_masked_fraction"] == pytest.approx(3 / 5)
    assert m["rollout_rs_ratio_fraction_high"] == 0.5


def test_geometric_rejection_uses_the_geometric_mean_of_the_row():
    # Geometric means: row 0 4 ** (1/3) = 1.587, row 1 sqrt(3) = 1.732.
    mask, _ = compute_rollout_rejection_mask(LOG_RATIO, MASK, "geometric", 1.65)
    assert torch.equal(mask, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    mask, _ = compute_rollout_rejection_mask(LOG_RATIO, MASK, "geometric", 1.8, 1.6)
    assert torch.equal(mask, torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]))


def test_rejection_needs_a_known_level_and_a_threshold():
    with pytest.raises(ValueError, match="Invalid rollout_rs"):
        compute_rollout_rejection_mask(LOG_RATIO, MASK, "row", 2.0)
    with pytest.raises(ValueError, match="rollout_rs_threshold must be provided"):
        compute_rollout_rejection_mask(LOG_RATIO, MASK, "token", None)
    with pytest.raises(ValueError, match="Invalid rollout_is"):
        compute_rollout_correction_weights(LOG_RATIO, MASK, "geometric", 2.0)
    with pytest.raises(ValueError, match="rollout_is_threshold must be positive"):
        compute_rollout_correction_weights(LOG_RATIO, MASK, "token", 0.0)


def test_token_veto_rejects_a_row_with_a_catastrophic_valid_token():
    rollout = torch.zeros(2, 3)
    old = torch.log(torch.tensor([[1.0, 1e-5, 1.0], [1.0, 1.0, 1e-6]]))  # row 1's is padding
    weights, mask, m = compute_rollout_correction_and_rejection_mask(
        old, rollout, MASK, rollout_token_veto_threshold=1e-4
    )
    assert weights is None
    assert torch.equal(mask, torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]))
    assert m["rollout_corr/rollout_is_veto_fraction"] == 0.5
    assert m["rollout_corr/rollout_is_catastrophic_token_fraction"] == pytest.approx(1 / 5)


def test_the_pipeline_prefixes_verls_names_and_leaves_the_mask_alone_without_rejection():
    old, rollout = LOG_RATIO, torch.zeros(2, 3)
    weights, mask, m = compute_rollout_correction_and_rejection_mask(
        old, rollout, MASK, rollout_is="token", rollout_is_threshold=2.0
    )
    assert torch.equal(mask, MASK)
    assert torch.allclose(weights, torch.tensor([[2.0, 0.5, 2.0], [1.0, 2.0, 0.0]]))
    assert m["rollout_corr/rollout_is_veto_fraction"] == 0.0
    assert all(key.startswith("rollout_corr/") for key in m)
    assert {"rollout_corr/rollout_is_mean", "rollout_corr/kl", "rollout_corr/chi2_seq"} <= set(m)
    assert not any(key.startswith("rollout_corr/rollout_rs") for key in m)


def test_offpolicy_metrics_by_hand():
    rollout = torch.log(torch.tensor([[0.5, 0.5, 0.5], [0.25, 0.5, 0.9]]))
    old = rollout + LOG_RATIO  # pi_old = rho * pi_rollout
    m = compute_offpolicy_metrics(old, rollout, MASK)
    rho = torch.tensor([2.0, 0.5, 4.0, 1.0, 3.0])
    assert m["kl"] == pytest.approx(-rho.log().mean().item(), 1e-5)
    assert m["k3_kl"] == pytest.approx((rho - rho.log() - 1).mean().item(), 1e-5)
    assert m["chi2_token"] == pytest.approx((rho**2).mean().item() - 1, 1e-5)
    assert m["chi2_seq"] == pytest.approx((16.0 + 9.0) / 2 - 1, 1e-4)  # products 4 and 3
    train_mean = torch.stack([old[0].mean(), old[1, :2].mean()])
    roll_mean = torch.stack([rollout[0].mean(), rollout[1, :2].mean()])
    assert m["training_ppl"] == pytest.approx(torch.exp(-train_mean).mean().item(), 1e-5)
    assert m["rollout_ppl"] == pytest.approx(torch.exp(-roll_mean).mean().item(), 1e-5)
    assert m["log_ppl_diff"] == pytest.approx((roll_mean - train_mean).mean().item(), 1e-5)
    assert m["ppl_ratio"] == pytest.approx(torch.exp(roll_mean - train_mean).mean().item(), 1e-5)


@pytest.mark.parametrize("mode", ["vanilla", "gspo", "gpg", "cispo", "sapo"])
def test_every_policy_loss_multiplies_its_token_losses_by_the_is_weights(mode):
    torch.manual_seed(0)
    log_prob = torch.randn(2, 3)
    advantages = torch.randn(2, 3)
    ones = torch.ones(2, 3)
    weights = torch.tensor([[2.0, 0.5, 1.0], [1.0, 0.0, 3.0]])
    fn = get_policy_loss_fn(mode)
    # On-policy (old == current): every clip is inactive, so the loss is linear in the weights.
    plain, _ = fn(PolicyLossInputs(log_prob, log_prob, advantages, MASK), ActorConfig())
    weighted, _ = fn(
        PolicyLossInputs(log_prob, log_prob, advantages, MASK, rollout_is_weights=weights),
        ActorConfig(),
    )
    unit, _ = fn(
        PolicyLossInputs(log_prob, log_prob, advantages, MASK, rollout_is_weights=ones),
        ActorConfig(),
    )
    assert unit.item() == pytest.approx(plain.item())
    assert weighted.item() != pytest.approx(plain.item())
    if mode == "vanilla":  # -A r w over the 5 valid tokens, r = 1
        expected = -(advantages * weights * MASK).sum() / 5
        assert weighted.item() == pytest.approx(expected.item(), 1e-5)


def test_geo_mean_weights_each_sequence_by_the_geometric_mean_of_its_weights():
    log_prob = torch.zeros(2, 3)
    advantages = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]])
    weights = torch.tensor([[2.0, 0.5, 4.0], [1.0, 4.0, 9.0]])  # row 1's 9 is padding
    loss, _ = get_policy_loss_fn("geo_mean")(
        PolicyLossInputs(log_prob, log_prob, advantages, MASK, rollout_is_weights=weights),
        ActorConfig(),
    )
    # Row 0: -1 * 1 * (2 * 0.5 * 4) ** (1/3); row 1: 2 * 1 * (1 * 4) ** (1/2); mean of the two.
    expected = (-(4 ** (1 / 3)) + 2 * 2.0) / 2
    assert loss.item() == pytest.approx(expected, 1e-5)


def test_reinforce_is_minus_advantage_times_log_prob_times_weight():
    log_prob = torch.log(torch.tensor([[0.5, 0.25, 0.5], [0.5, 0.5, 0.5]])).requires_grad_()
    advantages = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    weights = torch.tensor([[2.0, 1.0, 1.0], [1.0, 0.5, 1.0]])
    loss, m = compute_policy_loss_reinforce(
        PolicyLossInputs(torch.zeros(2, 3), log_prob, advantages, MASK, "token-mean", weights)
    )
    expected = -(advantages * log_prob.detach() * weights * MASK).sum() / 5
    assert loss.item() == pytest.approx(expected.item(), 1e-6)
    assert m["actor/ppo_kl"] == pytest.approx(-(log_prob.detach() * MASK).sum().item() / 5, 1e-6)
    loss.backward()  # d/dlogp = -A w / 5 on valid tokens: the weights carry no gradient
    assert torch.allclose(log_prob.grad, -advantages * weights * MASK / 5)


def bypass(correction: RolloutCorrectionConfig) -> ActorConfig:
    """Return the actor config the actor hands the bypass_mode loss: verl's defaults and
    ``policy_loss.rollout_correction``."""
    return ActorConfig(
        policy_loss=PolicyLossConfig(loss_mode="bypass_mode", rollout_correction=correction)
    )


def test_bypass_mode_ppo_clip_is_vanilla_against_the_rollout_with_rejection():
    rollout = torch.log(torch.full((2, 3), 0.5))
    log_prob = rollout + LOG_RATIO  # pi / pi_rollout = RATIOS
    advantages = torch.ones(2, 3)
    config = RolloutCorrectionConfig(
        rollout_is="token", rollout_rs="token", rollout_rs_threshold=3.5
    )
    loss, m = compute_policy_loss_bypass_mode(
        PolicyLossInputs(rollout, log_prob, advantages, MASK, "token-mean"), bypass(config)
    )
    kept = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])  # the 4 is rejected
    vanilla, _ = get_policy_loss_fn("vanilla")(
        PolicyLossInputs(rollout, log_prob, advantages, kept), ActorConfig()
    )
    assert loss.item() == pytest.approx(vanilla.item())  # no IS weights on top of the ratio
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1 / 5)
    assert m["rollout_corr/rollout_is_max"] == pytest.approx(4.0)
    assert "actor/pg_clipfrac" in m


def test_bypass_mode_reinforce_applies_the_weights_of_the_current_policy():
    rollout = torch.log(torch.full((2, 3), 0.5))
    log_prob = rollout + LOG_RATIO
    advantages = torch.ones(2, 3)
    config = RolloutCorrectionConfig(
        rollout_is="token", rollout_is_threshold=2.0, bypass_mode=True, loss_type="reinforce"
    )
    loss, _ = compute_policy_loss_bypass_mode(
        PolicyLossInputs(rollout, log_prob, advantages, MASK, "token-mean"), bypass(config)
    )
    weights = torch.tensor([[2.0, 0.5, 2.0], [1.0, 2.0, 0.0]])
    expected = -(log_prob * weights * MASK).sum() / 5
    assert loss.item() == pytest.approx(expected.item(), 1e-5)
    config.loss_type = "a2c"
    with pytest.raises(ValueError, match="Invalid loss_type"):
        compute_policy_loss_bypass_mode(
            PolicyLossInputs(rollout, log_prob, advantages, MASK), bypass(config)
        )


def test_every_key_reaches_the_pipeline():
    config = RolloutCorrectionConfig(
        rollout_is="sequence",
        rollout_is_threshold=3.0,
        rollout_rs="geometric",
        rollout_rs_threshold=1.01,
        rollout_rs_threshold_lower=0.99,
        rollout_token_veto_threshold=1e-4,
        rollout_is_batch_normalize=True,
    )
    assert correction_settings(config) == {
        "rollout_is": "sequence",
        "rollout_is_threshold": 3.0,
        "rollout_rs": "geometric",
        "rollout_rs_threshold": 1.01,
        "rollout_rs_threshold_lower": 0.99,
        "rollout_token_veto_threshold": 1e-4,
        "rollout_is_batch_normalize": True,
    }


@pytest.mark.parametrize("rollout_is", [None, "token", "sequence"])
@pytest.mark.parametrize("rollout_rs", [None, "token", "sequence", "geometric"])
@pytest.mark.parametrize("veto", [None, 0.2])
@pytest.mark.parametrize("normalize", [False, True])
def test_agrees_with_verls_helper_on_random_batches(
    rollout_is, rollout_rs, veto, normalize, monkeypatch
):
    from tests.third_party.verl import rollout_corr_helper_0_7 as verl

    # The engine corrects the whole batch on the driver; verl's helper takes a process-wide mean
    # over ranks when this process belongs to a group, which an earlier in-process trainer test
    # leaves behind (the local trainer's one-rank group). Compare with the helper as it runs
    # outside any group.
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)

    generator = torch.Generator().manual_seed(7)
    bs, length = 16, 12
    rollout = -torch.rand(bs, length, generator=generator) * 3  # (bs, L) log-probs
    old = rollout + torch.randn(bs, length, generator=generator) * 0.3
    lengths = torch.randint(1, length + 1, (bs,), generator=generator)
    mask = (torch.arange(length) < lengths.unsqueeze(-1)).float()  # (bs, L)
    settings = {
        "rollout_is": rollout_is,
        "rollout_is_threshold": 2.0,
        "rollout_rs": rollout_rs,
        "rollout_rs_threshold": 3.0 if rollout_rs != "geometric" else 1.1,
        "rollout_rs_threshold_lower": None if rollout_rs != "token" else 0.6,
        "rollout_token_veto_threshold": veto,
        "rollout_is_batch_normalize": normalize,
    }
    ours = compute_rollout_correction_and_rejection_mask(old, rollout, mask, **settings)
    theirs = verl.compute_rollout_correction_and_rejection_mask(old, rollout, mask, **settings)
    if rollout_is is None:
        assert ours[0] is None and theirs[0] is None
    else:
        assert torch.allclose(ours[0], theirs[0].batch["rollout_is_weights"], rtol=1e-5)
    assert torch.equal(ours[1], theirs[1])
    assert sorted(ours[2]) == sorted(theirs[2])
    for key, value in theirs[2].items():
        assert ours[2][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
