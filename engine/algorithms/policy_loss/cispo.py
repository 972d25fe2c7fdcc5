"""CISPO: a clipped, detached importance weight on every token's gradient (``loss_mode=cispo``)."""

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


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Return CISPO's loss ``-sg[clamp(r, 1-low, 1+high)] * A * logp``.

    Clipped IS-weight Policy Optimization, MiniMax-M1, arXiv 2506.13585: the importance weight
    is clipped and detached instead of the update, so every token keeps a gradient.
    ``r = exp(clamp(logp - old_logp, -20, 20))``. ``clip_ratio_c`` is unused. Metrics:
    ``actor/pg_clipfrac`` (share of tokens whose weight was clipped), ``actor/ppo_kl``.
    Shapes: all ``(bs, L)``.
    """
    check_inputs(old_log_prob, log_prob, advantages, response_mask)
    low, high = clip_range(clip_ratio, clip_ratio_low, clip_ratio_high)
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)  # (bs, L)
    ratio = torch.exp(negative_approx_kl)  # (bs, L)
    clipped_ratio = torch.clamp(ratio, 1 - low, 1 + high).detach()  # (bs, L)
    pg_losses = -advantages * clipped_ratio * log_prob  # (bs, L)
    pg_losses = weighted(pg_losses, rollout_is_weights)  # (bs, L)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    clipped = ((ratio < 1 - low) | (ratio > 1 + high)).float()
    pg_clipfrac = masked_mean(clipped, response_mask)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)
    return pg_loss, {"actor/pg_clipfrac": pg_clipfrac.item(), "actor/ppo_kl": ppo_kl.item()}
