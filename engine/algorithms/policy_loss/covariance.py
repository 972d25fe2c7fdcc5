"""Clip-Cov and KL-Cov: the tokens whose advantage and log-prob covary most are held back.

Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
arXiv 2505.22617: such tokens drive the policy's entropy down; ``loss_mode=clip_cov`` detaches a
random few of them, ``loss_mode=kl_cov`` adds a KL penalty on the top ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.algorithms.policy_loss.base import PolicyLossInputs, clip_range, register_policy_loss
from engine.algorithms.torch_functional import masked_mean

if TYPE_CHECKING:
    from engine.algorithms.policy_loss.base import LossOutput
    from engine.config import ActorConfig


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(inputs: PolicyLossInputs, config: ActorConfig) -> LossOutput:
    """Return the Clip-Cov loss: PPO's clipped loss with high-covariance tokens detached.

    Clip-Cov, Cui et al., "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617.
    Per token ``cov = (A - mean(A)) * (logp - mean(logp))`` (masked means); among valid tokens
    not already clipped by PPO with ``clip_cov_lb < cov < clip_cov_ub``, a random
    ``max(1, int(clip_cov_ratio * #valid))`` get zero loss (and gradient). The draw uses torch's
    global generator, as verl does. Reads ``policy_loss.clip_cov_ratio``, ``clip_cov_lb``,
    ``clip_cov_ub`` and PPO's ``clip_ratio``, ``clip_ratio_low``, ``clip_ratio_high`` (no dual
    clip). Metrics: ``actor/pg_clipfrac`` (share of detached tokens), ``actor/ppo_kl``. Shapes:
    all ``(bs, L)``.
    """
    old_log_prob, log_prob = inputs.old_log_prob, inputs.log_prob  # (bs, L) each
    advantages, response_mask = inputs.advantages, inputs.response_mask  # (bs, L) each
    clip_cov_ratio = config.policy_loss.clip_cov_ratio
    clip_cov_lb, clip_cov_ub = config.policy_loss.clip_cov_lb, config.policy_loss.clip_cov_ub
    if clip_cov_ratio <= 0:
        raise ValueError(f"clip_cov_ratio must be greater than 0, got {clip_cov_ratio}.")
    low, high = clip_range(config)
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
    pg_loss = inputs.aggregate(pg_losses)
    return pg_loss, {"actor/pg_clipfrac": pg_clipfrac.item(), "actor/ppo_kl": ppo_kl.item()}


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(inputs: PolicyLossInputs, config: ActorConfig) -> LossOutput:
    """Return the KL-Cov loss: the unclipped surrogate plus a KL penalty on top-covariance tokens.

    KL-Cov, Cui et al., arXiv 2505.22617. ``L = -A r`` with ``r = exp(logp - old_logp)``; the
    ``max(1, int(kl_cov_ratio * #valid))`` valid tokens with the largest
    ``(A - mean A) * (logp - mean logp)`` get ``-A r + ppo_kl_coef * |logp - old_logp|``.
    Reads ``policy_loss.kl_cov_ratio`` and ``policy_loss.ppo_kl_coef``. Metric: ``actor/ppo_kl``
    (mean absolute log-ratio, as verl reports for this mode). Shapes: all ``(bs, L)``.
    """
    old_log_prob, log_prob = inputs.old_log_prob, inputs.log_prob  # (bs, L) each
    advantages, response_mask = inputs.advantages, inputs.response_mask  # (bs, L) each
    kl_cov_ratio, ppo_kl_coef = config.policy_loss.kl_cov_ratio, config.policy_loss.ppo_kl_coef
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
    pg_loss = inputs.aggregate(pg_losses)
    return pg_loss, {"actor/ppo_kl": ppo_kl_abs.item()}
