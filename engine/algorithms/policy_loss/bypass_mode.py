"""verl's bypass mode: the rollout's log-probs stand in for the old policy's, corrected in the loss.

``algorithm.rollout_correction.bypass_mode=True`` skips the old-log-prob forward pass; the update
then trains with ``loss_mode=bypass_mode``, which computes the rollout correction
(``engine.algorithms.rollout_correction``) between the current policy and the rollout's inside
the loss, and applies PPO's clipped loss or REINFORCE (``loss_type``).
"""

from __future__ import annotations

from typing import Any

import torch

from engine.algorithms.loss_aggregation import agg_loss
from engine.algorithms.names import BYPASS_LOSS_TYPES
from engine.algorithms.policy_loss.base import register_policy_loss
from engine.algorithms.policy_loss.vanilla import compute_policy_loss_vanilla
from engine.algorithms.rollout_correction import (
    compute_rollout_correction_and_rejection_mask,
    correction_settings,
)
from engine.algorithms.torch_functional import check_same_shape, masked_mean

# verl's algorithm.rollout_correction defaults with bypass mode on.
BYPASS_DEFAULTS = {
    "rollout_is": None,
    "rollout_is_threshold": 2.0,
    "rollout_rs": None,
    "rollout_rs_threshold": None,
    "rollout_rs_threshold_lower": None,
    "rollout_token_veto_threshold": None,
    "bypass_mode": True,
    "loss_type": "ppo_clip",
    "rollout_is_batch_normalize": False,
}


def compute_policy_loss_reinforce(
    rollout_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-sum",
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Return REINFORCE's loss ``-A * log pi * sg(w)`` (``w`` the IS weights, 1 when None).

    No ratio and no clip. Metric ``actor/ppo_kl``: ``E[log pi_rollout - log pi]``. All (bs, L).
    """
    check_same_shape(
        rollout_log_prob=rollout_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
    )
    pg_losses = -advantages * log_prob  # (bs, L)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    ppo_kl = masked_mean(rollout_log_prob - log_prob, response_mask)
    return pg_loss, {"actor/ppo_kl": ppo_kl.detach().item()}


@register_policy_loss("bypass_mode")
def compute_policy_loss_bypass_mode(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    rollout_correction: Any = None,
    **clip_kwargs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Return bypass mode's loss: ``old_log_prob`` is the rollout's; corrections use ``pi / pi_rollout``.

    verl's ``compute_policy_loss_bypass_mode``: the IS weights, rejection mask and veto are
    computed (without gradient) between the current ``log_prob`` and the rollout's; the rejection
    applies to both loss types. ``loss_type=ppo_clip``: PPO's clipped loss with the rollout as the
    old policy, no IS weights (the ratio already is one); ``reinforce``: REINFORCE with the IS
    weights. ``rollout_correction`` is the config section or a dict (None: verl's defaults, PPO's
    clipped loss and no correction); ``clip_kwargs`` are the vanilla loss's clip keys. Metrics:
    the loss's and every ``rollout_corr/*``. All tensors (bs, L).
    """
    if rollout_correction is None:
        rollout_correction = dict(BYPASS_DEFAULTS)
    settings = correction_settings(rollout_correction)
    get = (
        rollout_correction.get
        if isinstance(rollout_correction, dict)
        else lambda key: getattr(rollout_correction, key)
    )
    loss_type = get("loss_type")
    if loss_type not in BYPASS_LOSS_TYPES:
        raise ValueError(f"Invalid loss_type: {loss_type!r}; use one of {BYPASS_LOSS_TYPES}.")
    with torch.no_grad():
        weights, mask, metrics = compute_rollout_correction_and_rejection_mask(
            log_prob, old_log_prob, response_mask, **settings
        )
    if loss_type == "reinforce":
        pg_loss, pg_metrics = compute_policy_loss_reinforce(
            old_log_prob, log_prob, advantages, mask, loss_agg_mode, weights
        )
    else:
        pg_loss, pg_metrics = compute_policy_loss_vanilla(
            old_log_prob, log_prob, advantages, mask, loss_agg_mode, **clip_kwargs
        )
    pg_metrics.update(metrics)
    return pg_loss, pg_metrics
