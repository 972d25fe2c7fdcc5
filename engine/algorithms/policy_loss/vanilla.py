"""PPO's clipped surrogate loss with dual clip: ``loss_mode=vanilla``, verl's default."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.algorithms.policy_loss.base import PolicyLossInputs, clip_range, register_policy_loss
from engine.algorithms.torch_functional import masked_mean

if TYPE_CHECKING:
    from engine.algorithms.policy_loss.base import LossOutput
    from engine.config import ActorConfig


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(inputs: PolicyLossInputs, config: ActorConfig) -> LossOutput:
    """Return PPO's clipped surrogate loss with dual clip, and its clip metrics.

    PPO, Schulman et al., arXiv 1707.06347; dual clip, Ye et al., arXiv 1912.09729.
    ``r = exp(clamp(logp - old_logp, -20, 20))``; ``L = max(-A r, -A clamp(r, 1-low, 1+high))``;
    for ``A < 0`` also ``min(L, -A * clip_ratio_c)``. Metrics: ``actor/pg_clipfrac`` (share of
    tokens where the clip bites), ``actor/ppo_kl`` (mean ``old_logp - logp``),
    ``actor/pg_clipfrac_lower`` (share where the dual clip bites). Reads ``clip_ratio``,
    ``clip_ratio_low``, ``clip_ratio_high`` (low and high: None takes ``clip_ratio``) and
    ``clip_ratio_c``. Shapes: all ``(bs, L)``.
    """
    old_log_prob, log_prob = inputs.old_log_prob, inputs.log_prob  # (bs, L) each
    advantages, response_mask = inputs.advantages, inputs.response_mask  # (bs, L) each
    clip_ratio_c = config.clip_ratio_c
    if clip_ratio_c <= 1.0:
        raise ValueError(
            f"clip_ratio_c must be greater than 1.0 for the dual clip, got {clip_ratio_c}; "
            "the default is 3.0."
        )
    low, high = clip_range(config)
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)  # (bs, L)
    ratio = torch.exp(negative_approx_kl)  # (bs, L)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)

    pg_losses1 = -advantages * ratio  # (bs, L)
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - low, 1 + high)  # (bs, L)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)

    pg_losses3 = -advantages * clip_ratio_c  # (bs, L)
    clip_pg_losses2 = torch.minimum(pg_losses3, clip_pg_losses1)
    negative = advantages < 0
    pg_clipfrac_lower = masked_mean(
        (torch.gt(clip_pg_losses1, pg_losses3) & negative).float(), response_mask
    )
    pg_losses = torch.where(negative, clip_pg_losses2, clip_pg_losses1)  # (bs, L)
    pg_loss = inputs.aggregate(pg_losses)
    return pg_loss, {
        "actor/pg_clipfrac": pg_clipfrac.item(),
        "actor/ppo_kl": ppo_kl.item(),
        "actor/pg_clipfrac_lower": pg_clipfrac_lower.item(),
    }
