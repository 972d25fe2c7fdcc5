"""SAPO: a smooth sigmoid gate on the ratio in place of PPO's hard clip (``loss_mode=sapo``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.algorithms.policy_loss.base import PolicyLossInputs, register_policy_loss
from engine.algorithms.torch_functional import masked_mean

if TYPE_CHECKING:
    from engine.algorithms.policy_loss.base import LossOutput
    from engine.config import ActorConfig


@register_policy_loss("sapo")
def compute_policy_loss_sapo(inputs: PolicyLossInputs, config: ActorConfig) -> LossOutput:
    """Return SAPO's loss, a smooth sigmoid gate on the ratio in place of the hard clip.

    Soft Adaptive Policy Optimization, Gao et al., arXiv 2511.20347.
    ``r = exp(clamp(logp - old_logp, -20, 20))``; ``tau = tau_pos`` where ``A > 0``, else
    ``tau_neg``; ``f(r) = sigmoid(tau (r - 1)) * 4 / tau`` (slope 1 at ``r = 1``, so on-policy
    its gradient is the policy gradient's, fading as ``r`` moves away); ``L = -f(r) A``. The
    paper's defaults ``tau_pos = 1.0``, ``tau_neg = 1.05`` damp negative updates harder.
    The objective is a mean over sequences of token means, so the loss always aggregates with
    ``seq-mean-token-mean`` whatever ``loss_agg_mode`` says, as verl does. Reads ``tau_pos`` and
    ``tau_neg``. Metrics: ``actor/ppo_kl``, and ``actor/pg_clipfrac`` and
    ``actor/pg_clipfrac_lower`` always 0 (nothing is clipped; verl reports them so that every
    policy loss fills the same charts). Shapes: all ``(bs, L)``.
    """
    old_log_prob, log_prob = inputs.old_log_prob, inputs.log_prob  # (bs, L) each
    advantages, response_mask = inputs.advantages, inputs.response_mask  # (bs, L) each
    tau_pos, tau_neg = config.tau_pos, config.tau_neg
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
    pg_loss = inputs.aggregate(pg_losses, "seq-mean-token-mean")
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)
    return pg_loss, {
        "actor/pg_clipfrac": 0.0,
        "actor/ppo_kl": ppo_kl.item(),
        "actor/pg_clipfrac_lower": 0.0,
    }
