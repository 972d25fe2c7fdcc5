"""Advantage estimators, registered by ``algorithm.adv_estimator`` name as in verl's core_algos.

Each estimator takes verl's tensors in verl's order and returns ``(advantages, returns)``, both
``(bs, response_length)``; outcome estimators return the same tensor twice. ``index`` is the
per-sample group id (the prompt's uid): a sequence (numpy array, list) of any hashable, one per
row. Group statistics are computed with scatter-adds over a dense group id instead of verl's
per-sample Python loop; the formulas, and verl's conventions for a group of one (mean 0, std 1),
are the same. All estimators run under ``torch.no_grad()``: advantages are targets, not graphs.

verl's ``*_vectorized`` estimators are kept under their names with their own arithmetic, which is
not quite the loop versions': ``grpo_vectorized`` floors the group variance at ``epsilon``
(``std = sqrt(max(var, epsilon))``) and ``rloo_vectorized`` gives a group of one advantage 0
where ``rloo`` keeps its score. The optimal token baselines need the policy's token
probabilities: ``old_log_probs`` and ``sum_pi_squared`` (``sum_v pi_v^2`` per token).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from enum import StrEnum

import torch

from engine.algorithms.names import ADV_ESTIMATORS
from engine.algorithms.registry import Registry
from engine.algorithms.torch_functional import check_same_shape, masked_whiten

AdvantageFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]

# verl's enum of the estimators' names, made from the one list (member GAE = "gae", ...).
AdvantageEstimator = StrEnum(  # type: ignore[misc]
    "AdvantageEstimator", [(name.upper(), name) for name in ADV_ESTIMATORS]
)

# verl's names. A name is given as a string literal: names.ADV_ESTIMATORS reads it from this file.
ADV_ESTIMATOR_REGISTRY: Registry[AdvantageFn] = Registry(
    ADV_ESTIMATORS, "advantage estimator", "names", "ADV_ESTIMATORS", "advantages.py"
)
register_adv_est = ADV_ESTIMATOR_REGISTRY.register
get_adv_estimator_fn = ADV_ESTIMATOR_REGISTRY.lookup


def _group_ids(index: Sequence[Hashable], scores: torch.Tensor) -> tuple[torch.Tensor, list]:
    """Return a dense group id per sample ``(bs,)`` and the group keys in order of appearance."""
    if len(index) != scores.shape[0]:
        raise ValueError(
            f"index has {len(index)} entries but token_level_rewards has {scores.shape[0]} rows; "
            "give one group id per row."
        )
    ids: dict[Hashable, int] = {}
    dense = [ids.setdefault(key, len(ids)) for key in index]
    return torch.tensor(dense, dtype=torch.long, device=scores.device), list(ids)


def _group_stats(
    scores: torch.Tensor, group: torch.Tensor, n_groups: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return per-sample group mean, unbiased std and size, each ``(bs,)``; a group of one has
    mean 0 and std 1 (verl's convention)."""
    counts = torch.bincount(group, minlength=n_groups).to(scores.dtype)  # (G,)
    mean = scores.new_zeros(n_groups).index_add_(0, group, scores) / counts  # (G,)
    squares = scores.new_zeros(n_groups).index_add_(0, group, (scores - mean[group]) ** 2)
    std = torch.sqrt(squares / (counts - 1).clamp(min=1))  # (G,)
    single = counts == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean[group], std[group], counts[group]


@register_adv_est("gae")
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float | torch.Tensor,
    lam: float | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return GAE advantages (whitened over the batch's masked tokens) and returns ``A + V``.

    Generalized Advantage Estimation, Schulman et al., arXiv 1506.02438. Backwards over t with
    V after the last token = 0: ``delta_t = r_t + gamma * V_next - V_t``, ``A_t = delta_t +
    gamma * lam * A_next``; a masked step passes ``V_next`` and ``A_next`` through unchanged.
    Shapes: token_level_rewards, values, response_mask ``(bs, L)`` -> two ``(bs, L)``.
    """
    check_same_shape(
        token_level_rewards=token_level_rewards, values=values, response_mask=response_mask
    )
    with torch.no_grad():
        mask = response_mask.to(values.dtype)  # (bs, L)
        next_values = torch.zeros_like(values[:, 0])  # (bs,)
        last_gae = torch.zeros_like(values[:, 0])  # (bs,)
        reversed_advantages = []
        for t in reversed(range(token_level_rewards.shape[-1])):
            delta = token_level_rewards[:, t] + gamma * next_values - values[:, t]
            gae = delta + gamma * lam * last_gae
            next_values = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_values
            last_gae = gae * mask[:, t] + (1 - mask[:, t]) * last_gae
            reversed_advantages.append(last_gae)
        advantages = torch.stack(reversed_advantages[::-1], dim=1)  # (bs, L)
        returns = advantages + values
        advantages = masked_whiten(advantages, mask)
    return advantages, returns


@register_adv_est("grpo")
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Hashable],
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return GRPO's group-normalised outcome advantage, broadcast over the response.

    GRPO, DeepSeekMath, arXiv 2402.03300: ``A_i = (s_i - mean_g) / (std_g + epsilon)`` with
    ``s_i`` the summed reward and the unbiased std of the group; ``s_i - mean_g`` when
    ``norm_adv_by_std_in_grpo`` is False (Dr. GRPO, arXiv 2503.20783).
    Shapes: token_level_rewards, response_mask ``(bs, L)``, index ``(bs,)`` -> two ``(bs, L)``.
    """
    check_same_shape(token_level_rewards=token_level_rewards, response_mask=response_mask)
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)  # (bs,)
        group, keys = _group_ids(index, scores)
        mean, std, _ = _group_stats(scores, group, len(keys))
        advantages = scores - mean
        if norm_adv_by_std_in_grpo:
            advantages = advantages / (std + epsilon)
        advantages = advantages.unsqueeze(-1) * response_mask  # (bs, L)
    return advantages, advantages


@register_adv_est("rloo")
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Hashable],
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return the REINFORCE leave-one-out advantage ``n/(n-1) * (s_i - mean_g)``.

    RLOO, Ahmadian et al., arXiv 2402.14740: the baseline is the mean of the other n-1 samples
    of the group; a group of one keeps ``A = s``. ``epsilon`` is accepted as verl does, unused.
    Shapes: token_level_rewards, response_mask ``(bs, L)``, index ``(bs,)`` -> two ``(bs, L)``.
    """
    check_same_shape(token_level_rewards=token_level_rewards, response_mask=response_mask)
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)  # (bs,)
        group, keys = _group_ids(index, scores)
        mean, _, count = _group_stats(scores, group, len(keys))
        scale = count / (count - 1).clamp(min=1)
        advantages = torch.where(count > 1, scale * (scores - mean), scores)
        advantages = advantages.unsqueeze(-1) * response_mask  # (bs, L)
    return advantages, advantages


@register_adv_est("reinforce_plus_plus")
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return REINFORCE++ advantages: discounted returns whitened over the masked tokens.

    REINFORCE++, Hu, arXiv 2501.03262. ``G_t = r_t + gamma * G_{t+1}``, reset to 0 after the
    response ends (at masked steps); the advantage is ``masked_whiten(G) * mask``.
    Shapes: token_level_rewards, response_mask ``(bs, L)`` -> advantages, returns ``(bs, L)``.
    """
    check_same_shape(token_level_rewards=token_level_rewards, response_mask=response_mask)
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)  # (bs, L)
        returns = torch.zeros_like(token_level_rewards)
        running = torch.zeros_like(token_level_rewards[:, 0])  # (bs,)
        for t in reversed(range(token_level_rewards.shape[1])):
            running = token_level_rewards[:, t] + gamma * running
            returns[:, t] = running
            running = running * mask[:, t]  # reset after the end of the response
        advantages = masked_whiten(returns, mask) * mask
    return advantages, returns


@register_adv_est("reinforce_plus_plus_baseline")
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Hashable],
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return REINFORCE++ with a group-mean baseline, whitened over the batch's masked tokens.

    REINFORCE++-baseline, Hu, arXiv 2501.03262: ``s_i - mean_g`` broadcast over the response,
    then ``masked_whiten(., mask) * mask``. ``epsilon`` is accepted as verl does, unused.
    Shapes: token_level_rewards, response_mask ``(bs, L)``, index ``(bs,)`` -> two ``(bs, L)``.
    """
    check_same_shape(token_level_rewards=token_level_rewards, response_mask=response_mask)
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)  # (bs, L)
        scores = token_level_rewards.sum(dim=-1)  # (bs,)
        group, keys = _group_ids(index, scores)
        mean, _, _ = _group_stats(scores, group, len(keys))
        advantages = (scores - mean).unsqueeze(-1) * mask  # (bs, L)
        advantages = masked_whiten(advantages, mask) * mask
    return advantages, advantages


@register_adv_est("remax")
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor, reward_baselines: torch.Tensor, response_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ReMax advantages: the reward-to-go minus the greedy response's reward.

    ReMax, Li et al., arXiv 2310.10505. ``G_t = sum_{k>=t} r_k * m_k`` and
    ``A_t = G_t - b * m_t`` with ``b`` the reward of the greedy rollout of the same prompt.
    Shapes: token_level_rewards, response_mask ``(bs, L)``, reward_baselines ``(bs,)``
    -> advantages, returns ``(bs, L)``.
    """
    check_same_shape(token_level_rewards=token_level_rewards, response_mask=response_mask)
    if tuple(reward_baselines.shape) != tuple(token_level_rewards.shape[:1]):
        raise ValueError(
            f"reward_baselines has shape {tuple(reward_baselines.shape)} but token_level_rewards "
            f"has shape {tuple(token_level_rewards.shape)}; give one baseline per row, shape (bs,)."
        )
    with torch.no_grad():
        returns = (
            (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
        )
        advantages = returns - reward_baselines.unsqueeze(-1) * response_mask
    return advantages, returns


@register_adv_est("grpo_passk")
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Hashable],
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return the Pass@k advantage: only each group's best sample gets ``r_max - r_second``.

    Pass@k training, arXiv 2503.19595 (as in verl): the advantage is divided by
    ``std_g + epsilon`` when ``norm_adv_by_std_in_grpo``; every other sample gets 0. Each group
    needs at least two samples. Shapes: token_level_rewards, response_mask ``(bs, L)``, index
    ``(bs,)`` -> two ``(bs, L)``.
    """
    check_same_shape(token_level_rewards=token_level_rewards, response_mask=response_mask)
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)  # (bs,)
        group, keys = _group_ids(index, scores)
        advantages = torch.zeros_like(scores)  # (bs,)
        for g, key in enumerate(keys):
            members = torch.nonzero(group == g).squeeze(-1)  # (k,)
            if members.numel() < 2:
                raise ValueError(
                    f"grpo_passk needs at least 2 samples per group; group {key!r} has "
                    f"{members.numel()}. Set actor_rollout_ref.rollout.n >= 2."
                )
            rewards = scores[members]  # (k,)
            top, top_idx = torch.topk(rewards, 2)
            advantage = top[0] - top[1]
            if norm_adv_by_std_in_grpo:
                advantage = advantage / (torch.std(rewards) + epsilon)
            advantages[members[top_idx[0]]] = advantage
        advantages = advantages.unsqueeze(-1) * response_mask  # (bs, L)
    return advantages, advantages


@register_adv_est("opo")
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Hashable],
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return OPO's advantage ``s_i - b_g`` with the length-weighted baseline of the group.

    On-Policy RL with Optimal reward baseline (OPO), Hao et al., arXiv 2505.23585:
    ``b_g = sum_j |y_j| s_j / sum_j |y_j|`` over the group; a group of one has ``b = 0``.
    ``epsilon`` is accepted as verl does, unused. Shapes: token_level_rewards, response_mask
    ``(bs, L)``, index ``(bs,)`` -> two ``(bs, L)``.
    """
    check_same_shape(token_level_rewards=token_level_rewards, response_mask=response_mask)
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)  # (bs,)
        lengths = response_mask.sum(dim=-1).to(scores.dtype)  # (bs,)
        group, keys = _group_ids(index, scores)
        _, _, count = _group_stats(scores, group, len(keys))
        weighted = scores.new_zeros(len(keys)).index_add_(0, group, lengths * scores)  # (G,)
        total = scores.new_zeros(len(keys)).index_add_(0, group, lengths)  # (G,)
        baseline = (weighted / total.clamp(min=1))[group]  # (bs,)
        baseline = torch.where(count > 1, baseline, torch.zeros_like(baseline))
        advantages = (scores - baseline).unsqueeze(-1) * response_mask  # (bs, L)
    return advantages, advantages


@register_adv_est("gpg")
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Hashable],
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
    alpha: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return GPG's advantage ``alpha * (s_i - mean_g) / f_norm``.

    Group Policy Gradient (GPG), Chu et al., arXiv 2504.02546. As in verl, ``alpha`` is
    recomputed as ``bs / max(1, #samples with a non-zero score)``, the paper's correction for
    samples that carry no gradient; the ``alpha`` argument is accepted for verl's signature
    only, and ``epsilon`` is unused. Shapes: token_level_rewards, response_mask ``(bs, L)``,
    index ``(bs,)`` -> two ``(bs, L)``.
    """
    check_same_shape(token_level_rewards=token_level_rewards, response_mask=response_mask)
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)  # (bs,)
        group, keys = _group_ids(index, scores)
        mean, _, _ = _group_stats(scores, group, len(keys))
        alpha = scores.shape[0] / max(1, int(torch.count_nonzero(scores)))
        advantages = alpha * (scores - mean) / f_norm
        advantages = advantages.unsqueeze(-1) * response_mask  # (bs, L)
    return advantages, advantages


@register_adv_est("grpo_vectorized")
def compute_grpo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Hashable],
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return GRPO's advantage from verl's vectorised group statistics (``group_mean_std``).

    GRPO, DeepSeekMath, arXiv 2402.03300, as ``grpo`` but with the group variance from sums and
    sums of squares, floored at ``epsilon``: ``std_g = sqrt(max(var_g, epsilon))``, so a group
    whose scores are all equal has std ``sqrt(epsilon)`` (its advantages are 0 either way).
    A group of one has mean 0 and std 1. Shapes: token_level_rewards, response_mask ``(bs, L)``,
    index ``(bs,)`` -> two ``(bs, L)``.
    """
    check_same_shape(token_level_rewards=token_level_rewards, response_mask=response_mask)
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)  # (bs,)
        group, keys = _group_ids(index, scores)  # (bs,)
        zeros = scores.new_zeros(len(keys))  # (G,)
        count = torch.bincount(group, minlength=len(keys)).to(scores.dtype)  # (G,)
        s1 = zeros.index_add(0, group, scores)  # (G,)
        s2 = zeros.index_add(0, group, scores * scores)  # (G,)
        mean = s1 / count  # (G,)
        var = (s2 - s1 * s1 / count) / (count - 1).clamp(min=1)  # (G,)
        std = torch.sqrt(var.clamp(min=epsilon))  # (G,)
        single = count <= 1  # (G,)
        mean = torch.where(single, torch.zeros_like(mean), mean)  # (G,)
        std = torch.where(single, torch.ones_like(std), std)  # (G,)
        advantages = scores - mean[group]  # (bs,)
        if norm_adv_by_std_in_grpo:
            advantages = advantages / (std[group] + epsilon)  # (bs,)
        advantages = advantages.unsqueeze(-1) * response_mask  # (bs, L)
    return advantages, advantages


@register_adv_est("rloo_vectorized")
def compute_rloo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Hashable],
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return RLOO's advantage ``(n * s_i - sum_g) / (n - 1)`` in verl's vectorised form.

    RLOO, Ahmadian et al., arXiv 2402.14740: equal to ``rloo`` for groups of two or more; a
    group of one gets 0 here (``rloo`` keeps its score), as in verl. ``epsilon`` is accepted as
    verl does, unused. Shapes: token_level_rewards, response_mask ``(bs, L)``, index ``(bs,)``
    -> two ``(bs, L)``.
    """
    check_same_shape(token_level_rewards=token_level_rewards, response_mask=response_mask)
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)  # (bs,)
        group, keys = _group_ids(index, scores)  # (bs,)
        count = torch.bincount(group, minlength=len(keys)).to(scores.dtype)[group]  # (bs,)
        total = scores.new_zeros(len(keys)).index_add(0, group, scores)[group]  # (bs,)
        advantages = (count * scores - total) / (count - 1).clamp(min=1) * (count > 1)  # (bs,)
        advantages = advantages.unsqueeze(-1) * response_mask  # (bs, L)
    return advantages, advantages


def _path_variance(
    response_mask: torch.Tensor,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None,
) -> torch.Tensor:
    """Return the cumulative path-variance proxy ``W_t = sum_{j<=t} m_j rho_j^2 (1 - 2 pi_j +
    sum_v pi_v^2)``, ``(bs, L)``; ``rho`` is 1 without rollout importance weights."""
    w = 1 - 2 * torch.exp(old_log_probs) + sum_pi_squared  # (bs, L): ||score fn of token j||^2
    if rollout_is_weights is not None:
        w = w * rollout_is_weights**2  # (bs, L)
    return (w * response_mask).cumsum(dim=-1)  # (bs, L)


def _zero_longest_tail(baselines: torch.Tensor, lengths: torch.Tensor, members: list[int]) -> None:
    """Zero, in place, the baseline of a group's longest trajectory past the second-longest
    length, when that trajectory is the only one of its length: no other sample estimates it."""
    group_lengths = lengths[members]  # (k,)
    second, longest = torch.sort(group_lengths).values[-2:].tolist()
    at_max = torch.nonzero(group_lengths == longest).squeeze(-1)  # (j,)
    if at_max.numel() == 1 and longest > second:
        baselines[members[int(at_max[0])], int(second) :] = 0.0


def _group_baselines(
    returns: torch.Tensor,
    weights: torch.Tensor,
    group: torch.Tensor,
    n_groups: int,
    lengths: torch.Tensor,
    handle_zero_tail: bool,
    epsilon: float,
) -> torch.Tensor:
    """Return each sample's baseline ``sum_i G_i W_i / (sum_i W_i + epsilon)`` over its group,
    position by position.

    ``returns`` and ``weights`` are zero outside valid tokens; ``group`` holds ids in
    ``[0, n_groups]``, where ``n_groups`` is a spare group that never has a baseline. A group of
    one has none either. Shapes: returns, weights ``(bs, K)``, group, lengths ``(bs,)`` ->
    ``(bs, K)``.
    """
    zeros = weights.new_zeros(n_groups + 1, weights.shape[1])  # (G + 1, K)
    numerator = zeros.index_add(0, group, returns * weights)  # (G + 1, K)
    denominator = zeros.index_add(0, group, weights) + epsilon  # (G + 1, K)
    count = torch.bincount(group, minlength=n_groups + 1)  # (G + 1,)
    count[n_groups] = 0  # the spare group never has a baseline
    baselines = (numerator / denominator)[group] * (count[group] > 1).unsqueeze(-1)  # (bs, K)
    if handle_zero_tail:
        for g in range(n_groups):
            members = torch.nonzero(group == g).squeeze(-1).tolist()
            if len(members) > 1:
                _zero_longest_tail(baselines, lengths, members)
    return baselines


def _returns_and_path_variance(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return the Optimal Token Baselines' inputs: the mask as floats, the rewards-to-go ``G``
    and the cumulative path variance ``W`` (:func:`_path_variance`), each ``(bs, L)``."""
    check_same_shape(
        token_level_rewards=token_level_rewards,
        response_mask=response_mask,
        old_log_probs=old_log_probs,
        sum_pi_squared=sum_pi_squared,
    )
    mask = response_mask.to(token_level_rewards.dtype)  # (bs, L)
    returns = (token_level_rewards * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    w = _path_variance(mask, old_log_probs, sum_pi_squared, rollout_is_weights)  # (bs, L)
    return mask, returns, w


@register_adv_est("optimal_token_baseline")
def compute_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Hashable],
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = False,
    epsilon: float = 1e-8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return the Optimal Token Baseline advantage ``A_t = G_t - B_t`` and the returns ``G``.

    Optimal Token Baseline (verl's ``optimal_token_baseline``): a baseline per token position
    and group, ``B_t = sum_i G_it W_it / (sum_i W_it + epsilon)`` over the group's valid tokens,
    weighting each sample's reward-to-go ``G`` by its cumulative path variance ``W_t = sum_{j<=t}
    (1 - 2 pi_j + sum_v pi_v^2)`` (times ``rho_j^2`` with rollout IS weights), the variance-
    minimising baseline for the score function (Greensmith et al., JMLR 2004). A group of one
    has no baseline. ``handle_zero_tail`` zeroes the baseline of a group's unique longest sample
    past the second-longest length. Positions are the columns of the mask.
    Shapes: token_level_rewards, response_mask, old_log_probs, sum_pi_squared,
    rollout_is_weights ``(bs, L)``, index ``(bs,)`` -> advantages, returns ``(bs, L)``.
    """
    with torch.no_grad():
        mask, returns, w = _returns_and_path_variance(
            token_level_rewards, response_mask, old_log_probs, sum_pi_squared, rollout_is_weights
        )  # (bs, L) each
        group, keys = _group_ids(index, returns)  # (bs,)
        baselines = _group_baselines(
            returns * mask, w * mask, group, len(keys), mask.sum(dim=-1), handle_zero_tail, epsilon
        )  # (bs, L)
        advantages = (returns - baselines) * mask  # (bs, L)
    return advantages, returns


@register_adv_est("tir_optimal_token_baseline")
def compute_multi_turn_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Hashable],
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return the Optimal Token Baseline for multi-turn (tool-integrated) responses.

    As ``optimal_token_baseline``, but position ``k`` is a sample's k-th *generated* token, not
    the k-th column: a multi-turn mask has gaps where a tool or user spoke, and the baseline
    compares the samples' own tokens. Samples with no generated token take no part and get 0;
    ``handle_zero_tail`` is on by default, as in verl.
    Shapes: token_level_rewards, response_mask, old_log_probs, sum_pi_squared,
    rollout_is_weights ``(bs, L)``, index ``(bs,)`` -> advantages, returns ``(bs, L)``.
    """
    with torch.no_grad():
        mask, returns, w = _returns_and_path_variance(
            token_level_rewards, response_mask, old_log_probs, sum_pi_squared, rollout_is_weights
        )  # (bs, L) each
        valid = mask.bool()  # (bs, L)
        rows, cols = torch.nonzero(valid, as_tuple=True)  # (T,), (T,)
        pos = (valid.long().cumsum(dim=-1) - 1)[rows, cols]  # (T,): k-th generated token
        lengths = valid.sum(dim=-1)  # (bs,)
        width = int(lengths.max()) if lengths.numel() else 0
        packed_w = w.new_zeros(w.shape[0], width)  # (bs, K): tokens packed to the left
        packed_w[rows, pos] = w[rows, cols]
        packed_returns = torch.zeros_like(packed_w)  # (bs, K)
        packed_returns[rows, pos] = returns[rows, cols]
        group, keys = _group_ids(index, returns)  # (bs,)
        group = torch.where(lengths > 0, group, len(keys))  # (bs,): empty rows in a spare group
        baselines = _group_baselines(
            packed_returns, packed_w, group, len(keys), lengths, handle_zero_tail, epsilon
        )  # (bs, K)
        packed_advantages = packed_returns - baselines  # (bs, K)
        advantages = torch.zeros_like(returns)  # (bs, L)
        advantages[rows, cols] = packed_advantages[rows, pos]
        advantages = advantages * mask  # (bs, L)
    return advantages, returns
