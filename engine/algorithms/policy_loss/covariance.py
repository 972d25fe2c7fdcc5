"""Clip-Cov and KL-Cov: the tokens whose advantage and log-prob covary most are held back.

Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
arXiv 2505.22617: such tokens drive the policy's entropy down; ``loss_mode=clip_cov`` detaches a
random few of them, ``loss_mode=kl_cov`` adds a KL penalty on the top ones.
"""

from __future__ import annotations

import torch

from engine.algorithms.loss_aggregation import agg_loss
from engine.algorithms.policy_loss.base import (
    check_inputs,
    clip_range,
    register_policy_loss,
    weighted,
)
from engine.algorithms.torch_functional import masked_mean


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    clip_cov_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Return the Clip-Cov loss: PPO's clipped loss with high-covariance tokens detached.

    Clip-Cov, Cui et al., "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617.
    Per token ``cov = (A - mean(A)) * (logp - mean(logp))`` (masked means); among valid tokens
    not already clipped by PPO with ``clip_cov_lb < cov < clip_cov_ub``, a random
    ``max(1, int(clip_cov_ratio * #valid))`` get zero loss (and gradient). The draw uses torch's
    global generator, as verl does. ``clip_ratio_c`` is unused (no dual clip). Metrics:
    ``actor/pg_clipfrac`` (share of detached tokens), ``actor/ppo_kl``. Shapes: all ``(bs, L)``.
    """
    check_inputs(old_log_prob, log_prob, advantages, response_mask)
    if clip_cov_ratio <= 0:
        raise ValueError(f"clip_cov_ratio must be greater than 0, got {clip_cov_ratio}.")
    low, high = clip_range(clip_ratio, clip_ratio_low, clip_ratio_high)
    negative_approx_kl = log_prob - old_log_prob  # (bs, L)
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)
    pg_losses1 = -advantages * ratio  # (bs, L)
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - low, 1 + high)  # (bs, L)

    with torch.no_grad():
        valid = response_mask > 0  # (bs, L)
        cov = (advantages - masked_mean(advantages, response_mask)) * (
            log_prob - masked_mean(log_prob, response_mask)
        )  # (bs, L)
        candidates = valid & ~(pg_losses2 > pg_losses1) & (cov > clip_cov_lb) & (cov < clip_cov_ub)
        candidate_idx = torch.nonzero(candidates)  # (n, 2)
        clip_num = max(int(clip_cov_ratio * response_mask.sum().item()), 1)
        chosen = candidate_idx[torch.randperm(len(candidate_idx))[:clip_num]]
        corr = torch.ones_like(advantages)  # (bs, L)
        corr[chosen[:, 0], chosen[:, 1]] = 0
    pg_clipfrac = masked_mean((corr == 0).float(), response_mask)
    pg_losses = torch.maximum(pg_losses1, pg_losses2) * corr  # (bs, L)
    pg_losses = weighted(pg_losses, rollout_is_weights)  # (bs, L)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    return pg_loss, {"actor/pg_clipfrac": pg_clipfrac.item(), "actor/ppo_kl": ppo_kl.item()}


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    kl_cov_ratio: float = 0.0002,
    ppo_kl_coef: float = 0.1,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Return the KL-Cov loss: the unclipped surrogate plus a KL penalty on top-covariance tokens.

    KL-Cov, Cui et al., arXiv 2505.22617. ``L = -A r`` with ``r = exp(logp - old_logp)``; the
    ``max(1, int(kl_cov_ratio * #valid))`` valid tokens with the largest
    ``(A - mean A) * (logp - mean logp)`` get ``-A r + ppo_kl_coef * |logp - old_logp|``.
    The clip keys are unused. Metric: ``actor/ppo_kl`` (mean absolute log-ratio, as verl
    reports for this mode). Shapes: all ``(bs, L)``.
    """
    check_inputs(old_log_prob, log_prob, advantages, response_mask)
    if kl_cov_ratio <= 0:
        raise ValueError(f"kl_cov_ratio must be greater than 0, got {kl_cov_ratio}.")
    negative_approx_kl = log_prob - old_log_prob  # (bs, L)
    abs_kl = negative_approx_kl.abs()
    ratio = torch.exp(negative_approx_kl)
    ppo_kl_abs = masked_mean(abs_kl, response_mask)
    pg_losses1 = -advantages * ratio  # (bs, L)
    pg_losses_kl = pg_losses1 + ppo_kl_coef * abs_kl  # (bs, L)

    with torch.no_grad():
        valid = response_mask > 0  # (bs, L)
        penalised = torch.zeros(valid.shape, dtype=torch.bool, device=valid.device)  # (bs, L)
        valid_idx = torch.nonzero(valid.reshape(-1)).squeeze(-1)  # (n,)
        if valid_idx.numel() > 0:
            adv = advantages.reshape(-1)[valid_idx]  # (n,)
            logp = log_prob.detach().reshape(-1)[valid_idx]  # (n,)
            cov = (adv - adv.mean()) * (logp - logp.mean())  # (n,)
            k = max(1, int(valid_idx.numel() * kl_cov_ratio))
            top = valid_idx[torch.topk(cov, k, largest=True).indices]
            penalised.view(-1)[top] = True
    pg_losses = torch.where(penalised, pg_losses_kl, pg_losses1)  # (bs, L)
    pg_losses = weighted(pg_losses, rollout_is_weights)  # (bs, L)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    return pg_loss, {"actor/ppo_kl": ppo_kl_abs.item()}
