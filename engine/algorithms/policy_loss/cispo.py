"""CISPO: a clipped, detached importance weight on every token's gradient (``loss_mode=cispo``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.algorithms.policy_loss.base import PolicyLossInputs, clip_range, register_policy_loss
from engine.algorithms.torch_functional import masked_mean

if TYPE_CHECKING:
    from engine.algorithms.policy_loss.base import LossOutput
    from engine.config import ActorConfig


@register_policy_loss("cispo")
def compute_policy_loss_cispo(inputs: PolicyLossInputs, config: ActorConfig) -> LossOutput:
    """Return CISPO's loss ``-sg[clamp(r, 1-low, 1+high)] * A * logp``.

    Clipped IS-weight Policy Optimization, MiniMax-M1, arXiv 2506.13585: the importance weight
    is clipped and detached instead of the update, so every token keeps a gradient.
    ``r = exp(clamp(logp - old_logp, -20, 20))``. Reads ``clip_ratio``, ``clip_ratio_low`` and
    ``clip_ratio_high`` (None takes ``clip_ratio``). Metrics: ``actor/pg_clipfrac`` (share of
    tokens whose weight was clipped), ``actor/ppo_kl``, ``actor/pg_clipfrac_lower`` (always 0: no
    dual clip; verl reports it). Shapes: all ``(bs, L)``.
    """
    old_log_prob, log_prob = inputs.old_log_prob, inputs.log_prob  # (bs, L) each
    advantages, response_mask = inputs.advantages, inputs.response_mask  # (bs, L) each
    low, high = clip_range(config)
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)  # (bs, L)
    ratio = torch.exp(negative_approx_kl)  # (bs, L)
    clipped_ratio = torch.clamp(ratio, 1 - low, 1 + high).detach()  # (bs, L)
    pg_losses = -advantages * clipped_ratio * log_prob  # (bs, L)
    pg_loss = inputs.aggregate(pg_losses)
    clipped = ((ratio < 1 - low) | (ratio > 1 + high)).float()
    pg_clipfrac = masked_mean(clipped, response_mask)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)
    return pg_loss, {
        "actor/pg_clipfrac": pg_clipfrac.item(),
        "actor/ppo_kl": ppo_kl.item(),
        "actor/pg_clipfrac_lower": 0.0,
    }
