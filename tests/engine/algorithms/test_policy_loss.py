"""Policy losses and loss aggregation against hand-computed values, and their clipping properties."""

import math

import pytest
import torch

from engine.algorithms import (
    POLICY_LOSS_REGISTRY,
    agg_loss,
    compute_policy_loss_cispo,
    compute_policy_loss_clip_cov,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_kl_cov,
    compute_policy_loss_vanilla,
    get_policy_loss_fn,
)

# Ratios 1, 1.5, 0.5 with A = +1; ratios 1.1, 4, 0.5 with A = -1, -1, +1 (last token masked).
RATIOS = torch.tensor([[1.0, 1.5, 0.5], [1.1, 4.0, 0.5]])
ADV = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 1.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
OLD = torch.zeros(2, 3)


def test_vanilla_ppo_hand_values():
    loss, metrics = compute_policy_loss_vanilla(OLD, RATIOS.log(), ADV, MASK)
    # per token: -1, -1.2 (clipped), -0.5, 1.1, 3 (dual clip of 4).
    assert loss.item() == pytest.approx((-1 - 1.2 - 0.5 + 1.1 + 3) / 5)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(1 / 5)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(1 / 5)
    log_ratios = [0, math.log(1.5), math.log(0.5), math.log(1.1), math.log(4)]
    assert metrics["actor/ppo_kl"] == pytest.approx(-sum(log_ratios) / 5)


def test_vanilla_asymmetric_clip_range():
    loss, _ = compute_policy_loss_vanilla(
        torch.zeros(1, 1),
        torch.tensor([[math.log(1.5)]]),
        torch.ones(1, 1),
        torch.ones(1, 1),
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
    )
    assert loss.item() == pytest.approx(-1.28)


def test_vanilla_gradient_vanishes_exactly_where_the_clip_bites():
    log_prob = RATIOS.log().requires_grad_()
    loss, _ = compute_policy_loss_vanilla(OLD, log_prob, ADV, MASK)
    loss.backward()
    # d(-A r)/d logp = -A r, divided by 5 valid tokens; clipped and dual-clipped tokens get 0.
    expected = torch.tensor([[-1.0, 0.0, -0.5], [1.1, 0.0, 0.0]]) / 5
    torch.testing.assert_close(log_prob.grad, expected)


def test_clipping_bounds_hold_for_extreme_ratios():
    ones = torch.ones(1, 4)
    log_prob = torch.tensor([[30.0, -30.0, 30.0, -30.0]])  # ratios clamp to exp(+-20)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    loss, _ = compute_policy_loss_vanilla(
        torch.zeros(1, 4), log_prob, adv, ones, loss_agg_mode="seq-mean-token-sum"
    )
    # A>0: -1.2 and -exp(-20); A<0: dual clip caps at 3; tiny ratio gives 0.8.
    assert loss.item() == pytest.approx(-1.2 - math.exp(-20) + 3.0 + 0.8)


def test_dual_clip_only_bites_when_advantage_is_negative():
    log_prob = torch.tensor([[math.log(5.0), math.log(5.0)]])
    positive = torch.ones(1, 2)
    for c in (1.01, 3.0, 100.0):
        loss, metrics = compute_policy_loss_vanilla(
            torch.zeros(1, 2), log_prob, positive, torch.ones(1, 2), clip_ratio_c=c
        )
        assert loss.item() == pytest.approx(-1.2) and metrics["actor/pg_clipfrac_lower"] == 0
    loss, metrics = compute_policy_loss_vanilla(
        torch.zeros(1, 2), log_prob, -positive, torch.ones(1, 2), clip_ratio_c=3.0
    )
    assert loss.item() == pytest.approx(3.0) and metrics["actor/pg_clipfrac_lower"] == 1.0


def test_vanilla_rejects_clip_ratio_c_not_above_one():
    with pytest.raises(ValueError, match="clip_ratio_c must be greater than 1.0.*got 1.0"):
        compute_policy_loss_vanilla(OLD, OLD, ADV, MASK, clip_ratio_c=1.0)


def test_masked_token_never_contributes_to_any_loss():
    poisoned = RATIOS.log().clone()
    poisoned[1, 2] = float("nan")
    for name, fn in POLICY_LOSS_REGISTRY.items():
        clean, _ = fn(OLD, RATIOS.log(), ADV, MASK)
        dirty, _ = fn(OLD, poisoned, ADV, MASK)
        assert dirty.item() == pytest.approx(clean.item()), name


def test_gspo_clips_a_sequence_level_ratio():
    log_prob = torch.tensor([[0.1, 0.2, 0.3], [-0.1, -0.3, 5.0]], requires_grad=True)
    loss, metrics = compute_policy_loss_gspo(OLD, log_prob, ADV, MASK)
    # s = exp(0.2) clipped to 1 + 4e-4 (A=+1); s = exp(-0.2) clipped to 1 - 3e-4 (A=-1).
    assert loss.item() == pytest.approx((-(1 + 4e-4) + (1 - 3e-4)) / 2, abs=1e-7)
    assert metrics == pytest.approx({"actor/pg_clipfrac": 1.0, "actor/ppo_kl": -0.2 / 5})
    wide, _ = compute_policy_loss_gspo(
        OLD, log_prob, ADV, MASK, clip_ratio_low=10, clip_ratio_high=10
    )
    wide.backward()
    # Each token's gradient is -A * s_i / (|y_i| * 2 sequences): the stop-gradient trick.
    expected = torch.tensor([[-math.exp(0.2) / 6] * 3, [math.exp(-0.2) / 4] * 2 + [0.0]])
    torch.testing.assert_close(log_prob.grad, expected)


def test_gpg_is_plain_policy_gradient():
    log_prob = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.0, -9.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])
    loss, metrics = compute_policy_loss_gpg(OLD, log_prob, adv, MASK)
    assert loss.item() == pytest.approx(9 / 5) and metrics == {}


def test_cispo_detaches_the_clipped_weight():
    log_prob = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = log_prob.detach() - torch.tensor([[math.log(1.5), math.log(0.9)]])
    adv = torch.tensor([[1.0, -1.0]])
    loss, metrics = compute_policy_loss_cispo(old, log_prob, adv, torch.ones(1, 2))
    # weights 1.2 (clipped from 1.5) and 0.9: (1.2 * 1 - 0.9 * 2) / 2
    assert loss.item() == pytest.approx(-0.3)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)
    loss.backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-0.6, 0.45]]))


# Covariance (A - mean A)(logp - mean logp) is 3 at (0, 0), 0 at (0, 1) and (1, 0), -3 at (1, 1).
COV_ADV = torch.tensor([[3.0, 0.0], [0.0, -3.0]])
COV_LOGP = torch.tensor([[-1.0, -3.0], [-3.0, -1.0]])


def test_clip_cov_detaches_the_high_covariance_token():
    log_prob = COV_LOGP.clone().requires_grad_()
    loss, metrics = compute_policy_loss_clip_cov(COV_LOGP, log_prob, COV_ADV, torch.ones(2, 2))
    assert loss.item() == pytest.approx(3 / 4)  # -3 at (0, 0) is dropped; 3 at (1, 1) stays
    assert metrics["actor/pg_clipfrac"] == pytest.approx(1 / 4)
    loss.backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[0.0, 0.0], [0.0, 0.75]]))
    kept, metrics = compute_policy_loss_clip_cov(
        COV_LOGP, COV_LOGP, COV_ADV, torch.ones(2, 2), clip_cov_ub=2.0
    )
    assert kept.item() == pytest.approx(0.0) and metrics["actor/pg_clipfrac"] == 0.0


def test_kl_cov_penalises_the_top_covariance_token():
    old = COV_LOGP - torch.tensor([[0.5, 0.0], [0.0, 0.0]])
    loss, metrics = compute_policy_loss_kl_cov(old, COV_LOGP, COV_ADV, torch.ones(2, 2))
    assert loss.item() == pytest.approx((-3 * math.exp(0.5) + 0.1 * 0.5 + 3) / 4)
    assert metrics == pytest.approx({"actor/ppo_kl": 0.5 / 4})
    strong, _ = compute_policy_loss_kl_cov(
        old, COV_LOGP, COV_ADV, torch.ones(2, 2), ppo_kl_coef=1.0
    )
    assert strong.item() == pytest.approx((-3 * math.exp(0.5) + 0.5 + 3) / 4)


def test_cov_losses_reject_non_positive_ratios():
    with pytest.raises(ValueError, match="clip_cov_ratio must be greater than 0"):
        compute_policy_loss_clip_cov(OLD, OLD, ADV, MASK, clip_cov_ratio=0.0)
    with pytest.raises(ValueError, match="kl_cov_ratio must be greater than 0"):
        compute_policy_loss_kl_cov(OLD, OLD, ADV, MASK, kl_cov_ratio=0.0)


LOSS_MAT = torch.arange(1.0, 13.0).reshape(3, 4)
AGG_MASK = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 21 / 5),  # (1 + 2 + 5 + 6 + 7) / 5
        ("seq-mean-token-sum", (3 + 18) / 2),  # the empty third sequence is left out
        ("seq-mean-token-mean", (1.5 + 6) / 2),
        ("seq-mean-token-sum-norm", 21 / 4),  # divided by the response length
    ],
)
def test_agg_loss_modes(mode, expected):
    assert agg_loss(LOSS_MAT, AGG_MASK, mode).item() == pytest.approx(expected)
    poisoned = torch.where(AGG_MASK.bool(), LOSS_MAT, torch.full_like(LOSS_MAT, float("inf")))
    assert agg_loss(poisoned, AGG_MASK, mode).item() == pytest.approx(expected)


def test_agg_loss_rejects_unknown_mode_and_shapes():
    with pytest.raises(
        ValueError, match="Unknown loss_agg_mode 'mean'; valid modes are: token-mean"
    ):
        agg_loss(LOSS_MAT, AGG_MASK, "mean")
    with pytest.raises(
        ValueError, match=r"loss_mat has shape \(3, 4\), loss_mask has shape \(3, 3\)"
    ):
        agg_loss(LOSS_MAT, AGG_MASK[:, :3], "token-mean")


def test_registry_lists_valid_loss_modes():
    assert set(POLICY_LOSS_REGISTRY) == {"vanilla", "gspo", "gpg", "cispo", "clip_cov", "kl_cov"}
    assert get_policy_loss_fn("vanilla") is compute_policy_loss_vanilla
    with pytest.raises(
        ValueError, match="Unknown policy loss mode 'ppo'; valid loss modes are: cispo, clip_cov"
    ):
        get_policy_loss_fn("ppo")


def test_every_loss_accepts_the_common_clip_keys():
    for fn in POLICY_LOSS_REGISTRY.values():
        loss, _ = fn(
            OLD,
            RATIOS.log(),
            ADV,
            MASK,
            loss_agg_mode="token-mean",
            clip_ratio=0.2,
            clip_ratio_low=0.2,
            clip_ratio_high=0.28,
            clip_ratio_c=3.0,
        )
        assert torch.isfinite(loss)


def test_policy_losses_name_mismatched_shapes():
    with pytest.raises(ValueError, match=r"advantages has shape \(2, 2\)"):
        compute_policy_loss_vanilla(OLD, OLD, ADV[:, :2], MASK)
