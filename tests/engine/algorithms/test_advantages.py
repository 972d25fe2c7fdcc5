"""Advantage estimators against hand-computed values on 4x3 / 2x3 batches, and their properties."""

import math

import numpy as np
import pytest
import torch

from engine.algorithms import (
    ADV_ESTIMATOR_REGISTRY,
    AdvantageEstimator,
    compute_gae_advantage_return,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    get_adv_estimator_fn,
    register_adv_est,
)

# Group "a" has scores 1, 2, 6 (mean 3, unbiased std sqrt(7)); "b" is a single sample scoring 5.
REWARDS = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0], [6.0, 0.0, 0.0], [0.0, 5.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
INDEX = np.array(["a", "a", "a", "b"], dtype=object)


def _per_sample(advantages):
    """Return the advantage of each row (constant over its valid tokens)."""
    assert torch.all(advantages[MASK == 0] == 0)
    return advantages[:, 0]


def test_grpo_normalises_by_group_mean_and_unbiased_std():
    advantages, returns = compute_grpo_outcome_advantage(REWARDS, MASK, INDEX)
    s7 = math.sqrt(7) + 1e-6
    expected = torch.tensor([-2 / s7, -1 / s7, 3 / s7, 5 / (1 + 1e-6)])
    torch.testing.assert_close(_per_sample(advantages), expected)
    torch.testing.assert_close(advantages, expected.unsqueeze(-1) * MASK)
    assert returns is advantages


def test_grpo_without_std_normalisation_subtracts_the_mean():
    advantages, _ = compute_grpo_outcome_advantage(
        REWARDS, MASK, INDEX, norm_adv_by_std_in_grpo=False
    )
    torch.testing.assert_close(_per_sample(advantages), torch.tensor([-2.0, -1.0, 3.0, 5.0]))


def test_grpo_advantages_sum_to_zero_per_group():
    torch.manual_seed(0)
    rewards = torch.rand(12, 4)
    index = np.repeat(np.arange(3), 4)
    advantages, _ = compute_grpo_outcome_advantage(rewards, torch.ones(12, 4), index)
    per_group = advantages[:, 0].reshape(3, 4).sum(dim=1)
    torch.testing.assert_close(per_group, torch.zeros(3), atol=1e-5, rtol=0)


def test_rloo_uses_the_mean_of_the_other_samples():
    advantages, _ = compute_rloo_outcome_advantage(REWARDS, MASK, INDEX)
    # 1 - (2+6)/2, 2 - (1+6)/2, 6 - (1+2)/2; the single sample keeps its score.
    torch.testing.assert_close(_per_sample(advantages), torch.tensor([-3.0, -1.5, 4.5, 5.0]))


def test_opo_uses_a_length_weighted_baseline():
    advantages, _ = compute_opo_outcome_advantage(REWARDS, MASK, INDEX)
    baseline = (3 * 1 + 2 * 2 + 1 * 6) / 6  # lengths 3, 2, 1
    expected = torch.tensor([1 - baseline, 2 - baseline, 6 - baseline, 5.0])
    torch.testing.assert_close(_per_sample(advantages), expected)


def test_gpg_scales_by_batch_over_nonzero_scores():
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 2.0]])
    advantages, _ = compute_gpg_outcome_advantage(
        rewards, torch.ones(4, 2), [0, 0, 1, 1], f_norm=2.0
    )
    # alpha = 4 / 2 non-zero scores = 2; group means 0.5 and 1.
    torch.testing.assert_close(advantages[:, 0], torch.tensor([0.5, -0.5, -1.0, 1.0]))


def test_grpo_passk_rewards_only_the_best_sample():
    rewards = torch.tensor([[1.0], [2.0], [6.0], [0.0], [1.0]])
    index = ["a", "a", "a", "b", "b"]
    advantages, _ = compute_grpo_passk_outcome_advantage(rewards, torch.ones(5, 1), index)
    expected = torch.tensor([0.0, 0.0, 4 / (math.sqrt(7) + 1e-6), 0.0, 1 / (math.sqrt(0.5) + 1e-6)])
    torch.testing.assert_close(advantages[:, 0], expected)
    plain, _ = compute_grpo_passk_outcome_advantage(
        rewards, torch.ones(5, 1), index, norm_adv_by_std_in_grpo=False
    )
    torch.testing.assert_close(plain[:, 0], torch.tensor([0.0, 0.0, 4.0, 0.0, 1.0]))


def test_grpo_passk_rejects_a_group_of_one():
    with pytest.raises(ValueError, match="at least 2 samples per group; group 'b' has 1"):
        compute_grpo_passk_outcome_advantage(REWARDS, MASK, INDEX)


def test_reinforce_plus_plus_discounts_resets_and_whitens():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 7.0]])  # the 7 lies in padding
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    advantages, returns = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.5)
    torch.testing.assert_close(returns[:, :2], torch.tensor([[0.25, 0.5], [0.5, 1.0]]))
    assert returns[0, 2] == 1.0
    # valid returns 0.25, 0.5, 1, 0.5, 1: mean 0.65, unbiased variance 0.45 / 4.
    expected = (torch.tensor([[0.25, 0.5, 1.0], [0.5, 1.0, 0.65]]) - 0.65) / math.sqrt(0.1125)
    torch.testing.assert_close(advantages, expected * mask)


def test_reinforce_plus_plus_baseline_subtracts_group_mean_then_whitens():
    rewards = torch.tensor([[0.0, 1.0], [3.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    advantages, _ = compute_reinforce_plus_plus_baseline_outcome_advantage(
        rewards, mask, ["p", "p"]
    )
    # tokens -1, -1, 1: mean -1/3, unbiased variance 4/3.
    expected = torch.tensor([[-2 / 3, -2 / 3], [4 / 3, 0.0]]) / math.sqrt(4 / 3)
    torch.testing.assert_close(advantages, expected)


def test_remax_subtracts_the_greedy_baseline_from_reward_to_go():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    advantages, returns = compute_remax_outcome_advantage(rewards, torch.tensor([0.5, 1.0]), mask)
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]]))
    torch.testing.assert_close(advantages, torch.tensor([[0.5, 0.5, 0.5], [1.0, 1.0, 0.0]]))
    with pytest.raises(ValueError, match=r"reward_baselines has shape \(3,\)"):
        compute_remax_outcome_advantage(rewards, torch.zeros(3), mask)


def test_gae_with_gamma_lam_one_is_monte_carlo_then_whitened():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    values = torch.tensor([[1.0, 2.0, 3.0], [0.5, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    advantages, returns = compute_gae_advantage_return(rewards, values, mask, gamma=1.0, lam=1.0)
    # raw advantages 0, -1, -2 / 0.5, 0 (masked step 0): mean -0.5, unbiased variance 1.
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]))
    expected = torch.tensor([[0.5, -0.5, -1.5], [1.0, 0.5, 0.5]])
    torch.testing.assert_close(advantages, expected)


def test_gae_carries_value_and_advantage_through_a_masked_step():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.5, 0.5], [0.5, 9.0, 0.5]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
    _, returns = compute_gae_advantage_return(rewards, values, mask, gamma=0.5, lam=0.5)
    # Row 0: A = -0.28125, -0.125, 0.5. Row 1 skips t=1: its 9.0 never enters a delta.
    torch.testing.assert_close(returns[0], torch.tensor([0.21875, 0.375, 1.0]))
    torch.testing.assert_close(returns[1], torch.tensor([0.375, 9.5, 1.0]))


def test_a_masked_token_never_changes_valid_advantages():
    torch.manual_seed(3)
    rewards, values = torch.rand(3, 4), torch.rand(3, 4)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    noisy_values = torch.where(mask.bool(), values, torch.full_like(values, 123.0))
    a, _ = compute_gae_advantage_return(rewards, values, mask, gamma=0.9, lam=0.8)
    b, _ = compute_gae_advantage_return(rewards, noisy_values, mask, gamma=0.9, lam=0.8)
    torch.testing.assert_close(a[mask.bool()], b[mask.bool()])


def test_whitening_estimators_reject_an_empty_mask():
    empty = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="mask is empty"):
        compute_gae_advantage_return(
            torch.zeros(2, 3), torch.zeros(2, 3), empty, gamma=1.0, lam=1.0
        )
    with pytest.raises(ValueError, match="mask is empty"):
        compute_reinforce_plus_plus_outcome_advantage(torch.zeros(2, 3), empty)


def test_shape_and_index_mismatches_are_named():
    with pytest.raises(
        ValueError,
        match=r"token_level_rewards has shape \(4, 3\), response_mask has shape \(4, 2\)",
    ):
        compute_grpo_outcome_advantage(REWARDS, MASK[:, :2], INDEX)
    with pytest.raises(ValueError, match="index has 3 entries but token_level_rewards has 4 rows"):
        compute_rloo_outcome_advantage(REWARDS, MASK, INDEX[:3])


def test_registry_holds_every_estimator_under_verl_names():
    assert set(ADV_ESTIMATOR_REGISTRY) == {e.value for e in AdvantageEstimator}
    assert get_adv_estimator_fn("grpo") is compute_grpo_outcome_advantage
    assert get_adv_estimator_fn(AdvantageEstimator.GAE) is compute_gae_advantage_return
    assert AdvantageEstimator("rloo") == "rloo"


def test_registry_rejects_unknown_and_duplicate_names():
    with pytest.raises(
        ValueError, match="Unknown advantage estimator 'ppo'; valid names are: gae, gpg, grpo"
    ):
        get_adv_estimator_fn("ppo")
    with pytest.raises(ValueError, match="'grpo' is already registered"):
        register_adv_est("grpo")(lambda: None)
