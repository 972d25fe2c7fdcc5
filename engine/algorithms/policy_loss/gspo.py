"""GSPO: PPO's clip on a sequence-level importance ratio (``loss_mode=gspo``)."""

from __future__ import annotations

import torch

from engine.algorithms.loss_aggregation import agg_loss
from engine.algorithms.policy_loss.base import (
    check_inputs,
    clip_range,
    register_policy_loss,
    weighted,
)
from engine.algorithms.torch_functional import masked_mean, masked_sum


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = 3e-4,
    clip_ratio_high: float | None = 4e-4,
    clip_ratio_c: float = 3.0,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Return GSPO's loss, clipping a sequence-level importance ratio.

    Group Sequence Policy Optimization, Zheng et al., arXiv 2507.18071.
    ``s_i = exp(mean_t(logp - old_logp))`` over the valid tokens of sequence i; each token uses
    ``s_it = sg[s_i] * p_t / sg[p_t]`` (log-space, clamped at 10), whose value is ``s_i`` and
    whose gradient is the token's. ``L = max(-A s_it, -A clamp(s_it, 1-low, 1+high))``; the
    paper's ranges 3e-4 / 4e-4 are the defaults, None falls back to ``clip_ratio``.
    ``clip_ratio_c`` is accepted for a uniform call site and unused. Metrics:
    ``actor/pg_clipfrac``, ``actor/ppo_kl``. Shapes: all ``(bs, L)``.
    """
    check_inputs(old_log_prob, log_prob, advantages, response_mask)
    low, high = clip_range(clip_ratio, clip_ratio_low, clip_ratio_high)
    negative_approx_kl = log_prob - old_log_prob  # (bs, L)
    mask = response_mask.to(log_prob.dtype)
    seq_lengths = mask.sum(dim=-1).clamp(min=1)  # (bs,)
    seq_log_ratio = masked_sum(negative_approx_kl, mask, axis=-1) / seq_lengths  # (bs,)
    log_token_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    seq_importance_ratio = torch.exp(torch.clamp(log_token_ratio, max=10.0))  # (bs, L)

    pg_losses1 = -advantages * seq_importance_ratio
    pg_losses2 = -advantages * torch.clamp(seq_importance_ratio, 1 - low, 1 + high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)  # (bs, L)
    pg_losses = weighted(pg_losses, rollout_is_weights)  # (bs, L)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)
    return pg_loss, {"actor/pg_clipfrac": pg_clipfrac.item(), "actor/ppo_kl": ppo_kl.item()}
