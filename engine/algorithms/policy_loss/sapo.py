"""SAPO: a smooth sigmoid gate on the ratio in place of PPO's hard clip (``loss_mode=sapo``)."""

from __future__ import annotations

import torch

from engine.algorithms.loss_aggregation import agg_loss
from engine.algorithms.policy_loss.base import check_inputs, register_policy_loss, weighted
from engine.algorithms.torch_functional import masked_mean


@register_policy_loss("sapo")
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Return SAPO's loss, a smooth sigmoid gate on the ratio in place of the hard clip.

    Soft Adaptive Policy Optimization, Gao et al., arXiv 2511.20347.
    ``r = exp(clamp(logp - old_logp, -20, 20))``; ``tau = tau_pos`` where ``A > 0``, else
    ``tau_neg``; ``f(r) = sigmoid(tau (r - 1)) * 4 / tau`` (slope 1 at ``r = 1``, so on-policy
    its gradient is the policy gradient's, fading as ``r`` moves away); ``L = -f(r) A``. The
    paper's defaults ``tau_pos = 1.0``, ``tau_neg = 1.05`` damp negative updates harder.
    The objective is a mean over sequences of token means, so the loss always aggregates with
    ``seq-mean-token-mean`` whatever ``loss_agg_mode`` says, as verl does. The clip keys are
    unused. Metric: ``actor/ppo_kl``. Shapes: all ``(bs, L)``.
    """
    check_inputs(old_log_prob, log_prob, advantages, response_mask)
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(
            f"tau_pos and tau_neg must be greater than 0, got {tau_pos} and {tau_neg}; "
            "the paper's defaults are 1.0 and 1.05."
        )
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)  # (bs, L)
    ratio = torch.exp(negative_approx_kl)  # (bs, L)
    taus = torch.where(advantages > 0, tau_pos, tau_neg).to(ratio.dtype)  # (bs, L)
    gates = torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus)  # (bs, L) f(r)
    pg_losses = -gates * advantages  # (bs, L)
    pg_losses = weighted(pg_losses, rollout_is_weights)  # (bs, L)
    pg_loss = agg_loss(pg_losses, response_mask, "seq-mean-token-mean")
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)
    return pg_loss, {"actor/ppo_kl": ppo_kl.item()}
