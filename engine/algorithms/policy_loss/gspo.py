"""GSPO: PPO's clip on a sequence-level importance ratio (``loss_mode=gspo``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.algorithms.policy_loss.base import PolicyLossInputs, clip_range, register_policy_loss
from engine.algorithms.torch_functional import masked_mean, masked_sum

if TYPE_CHECKING:
    from engine.algorithms.policy_loss.base import LossOutput
    from engine.config import ActorConfig


@register_policy_loss("gspo")
def compute_policy_loss_gspo(inputs: PolicyLossInputs, config: ActorConfig) -> LossOutput:
    """Return GSPO's loss, clipping a sequence-level importance ratio.

    Group Sequence Policy Optimization, Zheng et al., arXiv 2507.18071.
    ``s_i = exp(mean_t(logp - old_logp))`` over the valid tokens of sequence i; each token uses
    ``s_it = sg[s_i] * p_t / sg[p_t]`` (log-space, clamped at 10), whose value is ``s_i`` and
    whose gradient is the token's. ``L = max(-A s_it, -A clamp(s_it, 1-low, 1+high))``. Reads
    ``clip_ratio``, ``clip_ratio_low`` and ``clip_ratio_high`` (None takes ``clip_ratio``); the
    paper's ranges are 3e-4 and 4e-4, and its loss_agg_mode ``seq-mean-token-mean``. Metrics:
    ``actor/pg_clipfrac``, ``actor/ppo_kl``, ``actor/pg_clipfrac_lower`` (always 0: GSPO has no
    dual clip; verl reports it). Shapes: all ``(bs, L)``.
    """
    old_log_prob, log_prob = inputs.old_log_prob, inputs.log_prob  # (bs, L) each
    advantages, response_mask = inputs.advantages, inputs.response_mask  # (bs, L) each
    low, high = clip_range(config)
    negative_approx_kl = log_prob - old_log_prob  # (bs, L)
    mask = response_mask.to(log_prob.dtype)
    seq_lengths = mask.sum(dim=-1).clamp(min=1)  # (bs,)
    seq_log_ratio = masked_sum(negative_approx_kl, mask, axis=-1) / seq_lengths  # (bs,)
    log_token_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    seq_importance_ratio = torch.exp(torch.clamp(log_token_ratio, max=10.0))  # (bs, L)

    pg_losses1 = -advantages * seq_importance_ratio
    pg_losses2 = -advantages * torch.clamp(seq_importance_ratio, 1 - low, 1 + high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)  # (bs, L)
    pg_loss = inputs.aggregate(pg_losses)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)
    return pg_loss, {
        "actor/pg_clipfrac": pg_clipfrac.item(),
        "actor/ppo_kl": ppo_kl.item(),
        "actor/pg_clipfrac_lower": 0.0,
    }
