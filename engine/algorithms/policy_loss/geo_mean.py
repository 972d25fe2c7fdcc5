"""GMPO: each sequence weighted by the geometric mean of its token ratios (``loss_mode=geo_mean``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.algorithms.loss_aggregation import agg_loss
from engine.algorithms.policy_loss.base import PolicyLossInputs, clip_range, register_policy_loss
from engine.algorithms.torch_functional import masked_mean, masked_sum

if TYPE_CHECKING:
    from engine.algorithms.policy_loss.base import LossOutput
    from engine.config import ActorConfig


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(inputs: PolicyLossInputs, config: ActorConfig) -> LossOutput:
    """Return GMPO's loss, which weights each sequence by the geometric mean of its ratios.

    Geometric-Mean Policy Optimization, Zhao et al., arXiv 2507.20673. Per token the log-ratio
    ``d = logp - old_logp`` is clipped in log space, on the side the advantage's sign pushes:
    ``d' = sign(A) min(sign(A) d, sign(A) clamp(d, -low, high))``. Per sequence,
    ``R_i = exp(mean_t d')`` and ``A_i = mean_t A`` over its valid tokens (sequence-level
    advantages, as the paper assumes); ``L_i = -A_i R_i``, averaged as verl averages it: over
    every row of the micro-batch, empty ones included, whatever the global batch says (the
    micro-batches' shares then add up). ``policy_loss.geo_mean_global_batch`` averages over the
    sequences that hold a valid token instead, over the whole mini-batch in the trainer (through
    :func:`agg_loss`), so the update does not depend on the split. ``loss_agg_mode`` does not
    apply. Reads ``clip_ratio``, ``clip_ratio_low`` and
    ``clip_ratio_high`` (None takes ``clip_ratio``). Metrics: ``actor/pg_clipfrac`` (share of
    tokens clipped with ``A > 0``), ``actor/pg_clipfrac_lower`` (with ``A < 0``),
    ``actor/ppo_kl``. Shapes: inputs ``(bs, L)``.
    """
    old_log_prob, log_prob = inputs.old_log_prob, inputs.log_prob  # (bs, L) each
    advantages, response_mask = inputs.advantages, inputs.response_mask  # (bs, L) each
    low, high = clip_range(config)
    negative_approx_kl = log_prob - old_log_prob  # (bs, L)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)
    sign = torch.sign(advantages)  # (bs, L)
    clamped = torch.clamp(negative_approx_kl, -low, high)  # (bs, L)
    clipped_log_ratio = sign * torch.minimum(sign * negative_approx_kl, sign * clamped)  # (bs, L)

    seq_tokens = response_mask.sum(dim=-1) + 1e-8  # (bs,)
    seq_ratio = torch.exp(masked_sum(clipped_log_ratio, response_mask, axis=-1) / seq_tokens)
    seq_advantage = masked_sum(advantages, response_mask, axis=-1) / seq_tokens  # (bs,)
    seq_losses = (-seq_advantage * seq_ratio).unsqueeze(-1)  # (bs, 1)
    seq_valid = (response_mask.sum(dim=-1, keepdim=True) > 0).to(seq_losses.dtype)  # (bs, 1)
    rollout_is_weights = inputs.rollout_is_weights  # (bs, L) or None
    if rollout_is_weights is not None:  # (bs, L) -> (bs, 1): their geometric mean per sequence
        log_weights = masked_sum(torch.log(rollout_is_weights + 1e-10), response_mask, axis=-1)
        seq_losses = seq_losses * torch.exp(log_weights / seq_tokens).unsqueeze(-1)
    if config.policy_loss.geo_mean_global_batch:
        pg_loss = agg_loss(seq_losses, seq_valid, "seq-mean-token-sum", inputs.global_batch)
    else:  # verl's: the mean over all rows of this micro-batch
        pg_loss = seq_losses.mean()

    clipped = torch.ne(negative_approx_kl, clamped)  # (bs, L)
    pg_clipfrac = masked_mean((clipped & (advantages > 0)).float(), response_mask)
    pg_clipfrac_lower = masked_mean((clipped & (advantages < 0)).float(), response_mask)
    return pg_loss, {
        "actor/pg_clipfrac": pg_clipfrac.item(),
        "actor/ppo_kl": ppo_kl.item(),
        "actor/pg_clipfrac_lower": pg_clipfrac_lower.item(),
    }
