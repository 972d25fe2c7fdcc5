"""GPG's plain policy gradient, no ratio and no clip (``loss_mode=gpg``)."""

from __future__ import annotations

import torch

from engine.algorithms.loss_aggregation import agg_loss
from engine.algorithms.policy_loss.base import check_inputs, register_policy_loss, weighted


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
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
    """Return GPG's plain policy-gradient loss ``-logp * A``, with no ratio and no clip.

    Group Policy Gradient, Chu et al., arXiv 2504.02546. ``old_log_prob`` and the clip keys are
    accepted for a uniform call site and unused; no metrics apply. Shapes: all ``(bs, L)``.
    """
    check_inputs(old_log_prob, log_prob, advantages, response_mask)
    pg_losses = -log_prob * advantages  # (bs, L)
    pg_losses = weighted(pg_losses, rollout_is_weights)  # (bs, L)
    return agg_loss(pg_losses, response_mask, loss_agg_mode), {}
