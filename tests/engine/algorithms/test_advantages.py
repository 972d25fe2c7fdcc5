"""Advantage estimators against hand-computed values on 4x3 / 2x3 batches, and their properties.

The optimal token baselines are also compared, on random batches, with verl's own loops, ported
below as reference implementations.
"""

import math

import numpy as np
import pytest
import torch

from engine.algorithms.advantages import (
    ADV_ESTIMATOR_REGISTRY,
    AdvantageEstimator,
    compute_gae_advantage_return,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_opo_outcome_advantage,
    compute_optimal_token_baseline_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
    get_adv_estimator_fn,
    register_adv_est,
)
from tests.third_party.verl.optimal_token_baseline import (
    verl_multi_turn_optimal_token_baseline,
    verl_optimal_token_baseline,
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
    assert get_adv_estimator_fn("rloo_vectorized") is compute_rloo_vectorized_outcome_advantage
    assert (
        get_adv_estimator_fn(AdvantageEstimator.TIR_OPTIMAL_TOKEN_BASELINE)
        is compute_multi_turn_optimal_token_baseline_advantage
    )
    assert AdvantageEstimator("rloo") == "rloo"


def test_registry_rejects_unknown_and_duplicate_names():
    with pytest.raises(
        ValueError, match="Unknown advantage estimator 'ppo'; valid names are: gae, gpg, grpo"
    ):
        get_adv_estimator_fn("ppo")
    with pytest.raises(ValueError, match="'grpo' is already registered"):
        register_adv_est("grpo")(lambda: None)


def test_grpo_vectorized_matches_grpo_and_floors_the_group_variance():
    advantages, returns = compute_grpo_vectorized_outcome_advantage(REWARDS, MASK, INDEX)
    s7 = math.sqrt(7) + 1e-6  # scores 1, 2, 6: (41 - 81/3) / 2 = 7
    expected = torch.tensor([-2 / s7, -1 / s7, 3 / s7, 5 / (1 + 1e-6)])
    torch.testing.assert_close(_per_sample(advantages), expected)
    assert returns is advantages
    # Scores 0 and 1e-4: variance 5e-9 is floored at epsilon=1e-6, so std = 1e-3 (grpo: 7.1e-5).
    tiny = torch.tensor([[0.0], [1e-4]])
    advantages, _ = compute_grpo_vectorized_outcome_advantage(tiny, torch.ones(2, 1), [0, 0])
    torch.testing.assert_close(advantages[:, 0], torch.tensor([-5e-5, 5e-5]) / (1e-3 + 1e-6))
    plain, _ = compute_grpo_vectorized_outcome_advantage(
        REWARDS, MASK, INDEX, norm_adv_by_std_in_grpo=False
    )
    torch.testing.assert_close(_per_sample(plain), torch.tensor([-2.0, -1.0, 3.0, 5.0]))


def test_rloo_vectorized_gives_a_group_of_one_zero():
    advantages, _ = compute_rloo_vectorized_outcome_advantage(REWARDS, MASK, INDEX)
    # (3 * 1 - 9) / 2, (3 * 2 - 9) / 2, (3 * 6 - 9) / 2; "b" alone: 0 (rloo keeps its 5).
    torch.testing.assert_close(_per_sample(advantages), torch.tensor([-3.0, -1.5, 4.5, 0.0]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vectorized_estimators_equal_the_loop_ones_on_random_groups(seed):
    generator = torch.Generator().manual_seed(seed)
    rewards = torch.randn(24, 5, generator=generator)
    mask = (torch.rand(24, 5, generator=generator) > 0.3).float()
    index = np.repeat(np.array(["p", "q", "r", "s"], dtype=object), [2, 4, 8, 10])
    for norm in (True, False):
        grpo, _ = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=norm)
        vec, _ = compute_grpo_vectorized_outcome_advantage(
            rewards, mask, index, norm_adv_by_std_in_grpo=norm
        )
        torch.testing.assert_close(vec, grpo, atol=1e-6, rtol=0)
    rloo, _ = compute_rloo_outcome_advantage(rewards, mask, index)
    vec, _ = compute_rloo_vectorized_outcome_advantage(rewards, mask, index)
    torch.testing.assert_close(vec, rloo, atol=1e-6, rtol=0)


# Two samples of group "a": pi = 0.5 and sum_v pi_v^2 = 0.5 on every token, so each token adds
# w = 1 - 2 * 0.5 + 0.5 = 0.5 to the path variance. Row 0 stops after one token.
OTB_REWARDS = torch.tensor([[2.0, 0.0], [0.0, 4.0]])  # returns: [2, 0] and [4, 4]
OTB_MASK = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
OTB_LOGP = torch.full((2, 2), math.log(0.5))
OTB_PI2 = torch.full((2, 2), 0.5)


def test_optimal_token_baseline_weights_returns_by_cumulative_path_variance():
    advantages, returns = compute_optimal_token_baseline_advantage(
        OTB_REWARDS, OTB_MASK, ["a", "a"], OTB_LOGP, OTB_PI2
    )
    torch.testing.assert_close(returns, torch.tensor([[2.0, 0.0], [4.0, 4.0]]))
    # t=0: W = 0.5, 0.5 -> B = (2 + 4) / 2 = 3; t=1: only row 1 (W = 1) -> B = 4.
    torch.testing.assert_close(advantages, torch.tensor([[-1.0, 0.0], [1.0, 0.0]]))
    # Row 1 alone is longest: past row 0's length its baseline is zeroed, A = G = 4.
    tail, _ = compute_optimal_token_baseline_advantage(
        OTB_REWARDS, OTB_MASK, ["a", "a"], OTB_LOGP, OTB_PI2, handle_zero_tail=True
    )
    torch.testing.assert_close(tail, torch.tensor([[-1.0, 0.0], [1.0, 4.0]]))
    # Rollout IS weight rho = 2 on row 0 scales its w by 4: B_0 = (2 * 2 + 4 * 0.5) / 2.5 = 2.4.
    rho = torch.tensor([[2.0, 2.0], [1.0, 1.0]])
    weighted, _ = compute_optimal_token_baseline_advantage(
        OTB_REWARDS, OTB_MASK, ["a", "a"], OTB_LOGP, OTB_PI2, rollout_is_weights=rho
    )
    torch.testing.assert_close(weighted[:, 0], torch.tensor([-0.4, 1.6]))
    # A deterministic token (pi = 1, sum pi^2 = 1) has w = 0: the baseline follows row 1.
    certain = torch.tensor([[0.0, 0.0], [math.log(0.5)] * 2])
    pi2 = torch.tensor([[1.0, 1.0], [0.5, 0.5]])
    follows, _ = compute_optimal_token_baseline_advantage(
        OTB_REWARDS, OTB_MASK, ["a", "a"], certain, pi2
    )
    torch.testing.assert_close(follows, torch.tensor([[-2.0, 0.0], [0.0, 0.0]]))


def test_optimal_token_baseline_leaves_a_group_of_one_its_return():
    advantages, returns = compute_optimal_token_baseline_advantage(
        OTB_REWARDS, OTB_MASK, ["a", "b"], OTB_LOGP, OTB_PI2
    )
    torch.testing.assert_close(advantages, returns * OTB_MASK)


def test_tir_optimal_token_baseline_aligns_generated_tokens_across_gaps():
    rewards = torch.tensor([[0.0, 0.0, 2.0], [0.0, 4.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])  # a tool spoke at 1
    logp, pi2 = torch.full((3, 3), math.log(0.5)), torch.full((3, 3), 0.5)
    index = ["a", "a", "a"]
    advantages, returns = compute_multi_turn_optimal_token_baseline_advantage(
        rewards, mask, index, logp, pi2
    )
    torch.testing.assert_close(returns[:2], torch.tensor([[2.0, 2.0, 2.0], [4.0, 4.0, 0.0]]))
    # Generated tokens k=0, 1 of both rows: W = 0.5, 1; G = 2, 2 and 4, 4 -> B = 3, 3.
    # The empty row takes no part and gets 0.
    expected = torch.tensor([[-1.0, 0.0, -1.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(advantages, expected)
    # By column, row 0's second token meets nothing of row 1 (B = its own return, 2).
    by_column, _ = compute_optimal_token_baseline_advantage(rewards, mask, index, logp, pi2)
    torch.testing.assert_close(by_column[:2], torch.tensor([[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))


def test_optimal_token_baselines_name_a_mismatched_input():
    with pytest.raises(ValueError, match=r"sum_pi_squared has shape \(2, 1\)"):
        compute_optimal_token_baseline_advantage(
            OTB_REWARDS, OTB_MASK, ["a", "a"], OTB_LOGP, OTB_PI2[:, :1]
        )


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("handle_zero_tail", [False, True])
def test_optimal_token_baselines_match_verl_on_random_batches(seed, handle_zero_tail):
    generator = torch.Generator().manual_seed(seed)
    bs, length = 16, 7
    rewards = torch.randn(bs, length, generator=generator)
    # Multi-turn masks: random gaps, random ends, one empty row, a unique longest row per group.
    mask = (torch.rand(bs, length, generator=generator) > 0.25).float()
    mask[3] = 0.0
    mask[0] = 1.0
    probs = torch.softmax(torch.randn(bs, length, 11, generator=generator), dim=-1)
    logp = torch.log(probs[..., 0])  # (bs, L): the sampled token is token 0
    pi2 = (probs**2).sum(-1)  # (bs, L)
    rho = torch.rand(bs, length, generator=generator) + 0.5
    index = np.array(list("aaaabbbbbcccccdd"), dtype=object)
    index[15] = "e"  # a group of one
    for is_weights in (None, rho):
        for ours, theirs in (
            (compute_optimal_token_baseline_advantage, verl_optimal_token_baseline),
            (
                compute_multi_turn_optimal_token_baseline_advantage,
                verl_multi_turn_optimal_token_baseline,
            ),
        ):
            args = (rewards, mask, index, logp, pi2, is_weights, handle_zero_tail)
            mine, my_returns = ours(*args)
            reference, reference_returns = theirs(*args)
            torch.testing.assert_close(mine, reference, atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(my_returns, reference_returns)


def test_the_trainer_names_what_an_optimal_token_baseline_lacks():
    from engine.config.algorithm import AlgorithmConfig
    from engine.data import DataProto
    from engine.trainer.advantage import compute_advantage

    batch = DataProto.from_dict(
        {
            "token_level_rewards": OTB_REWARDS,
            "response_mask": OTB_MASK,
            "rollout_log_probs": OTB_LOGP,
        },
        non_tensors={"uid": np.array(["a", "a"], dtype=object)},
    )
    algorithm = AlgorithmConfig(adv_estimator="optimal_token_baseline")
    with pytest.raises(
        ValueError,
        match="adv_estimator='optimal_token_baseline' needs sum_pi_squared in the batch and "
        "this step did not compute it; choose another estimator.",
    ):
        compute_advantage(batch, algorithm)
    batch.batch["sum_pi_squared"] = OTB_PI2  # the rollout's log-probs stand in for old ones
    advantages, _ = compute_advantage(batch, algorithm)
    torch.testing.assert_close(advantages, torch.tensor([[-1.0, 0.0], [1.0, 0.0]]))
