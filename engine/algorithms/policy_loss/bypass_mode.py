"""verl's bypass mode: the rollout's log-probs stand in for the old policy's, corrected in the loss.

``algorithm.rollout_correction.bypass_mode=True`` skips the old-log-prob forward pass; the update
then trains with ``loss_mode=bypass_mode``, which computes the rollout correction
(``engine.algorithms.rollout_correction``) between the current policy and the rollout's inside
the loss, and applies PPO's clipped loss or REINFORCE (``loss_type``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from engine.algorithms.names import BYPASS_LOSS_TYPES
from engine.algorithms.policy_loss.base import PolicyLossInputs, register_policy_loss
from engine.algorithms.policy_loss.vanilla import compute_policy_loss_vanilla
from engine.algorithms.rollout_correction import (
    compute_rollout_correction_and_rejection_mask,
    correction_settings,
)
from engine.algorithms.torch_functional import masked_mean

if TYPE_CHECKING:
    from engine.algorithms.policy_loss.base import LossOutput
    from engine.config import ActorConfig

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


def compute_policy_loss_reinforce(inputs: PolicyLossInputs) -> LossOutput:
    """Return REINFORCE's loss ``-A * log pi * sg(w)`` (``w`` the IS weights, 1 when None).

    ``inputs.old_log_prob`` is the rollout's. No ratio and no clip. Metric ``actor/ppo_kl``:
    ``E[log pi_rollout - log pi]``. All (bs, L).
    """
    rollout_log_prob, log_prob = inputs.old_log_prob, inputs.log_prob  # (bs, L) each
    pg_losses = -inputs.advantages * log_prob  # (bs, L)
    pg_loss = inputs.aggregate(pg_losses)
    ppo_kl = masked_mean(rollout_log_prob - log_prob, inputs.response_mask)
    return pg_loss, {"actor/ppo_kl": ppo_kl.detach().item()}


@register_policy_loss("bypass_mode")
def compute_policy_loss_bypass_mode(inputs: PolicyLossInputs, config: ActorConfig) -> LossOutput:
    """Return bypass mode's loss: ``old_log_prob`` is the rollout's; corrections use ``pi / pi_rollout``.

    verl's ``compute_policy_loss_bypass_mode``: the IS weights, rejection mask and veto are
    computed (without gradient) between the current ``log_prob`` and the rollout's; the rejection
    applies to both loss types. ``loss_type=ppo_clip``: PPO's clipped loss with the rollout as the
    old policy, no IS weights (the ratio already is one); ``reinforce``: REINFORCE with the IS
    weights. Reads ``policy_loss.rollout_correction`` (``algorithm.rollout_correction``, a config
    section or a dict, which the actor puts there as verl's trainer does; None: verl's defaults,
    PPO's clipped loss and no correction) and, for ``ppo_clip``, the vanilla loss's keys.
    Metrics: the loss's and every ``rollout_corr/*``. All tensors (bs, L).
    """
    rollout_correction = config.policy_loss.rollout_correction
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
            inputs.log_prob, inputs.old_log_prob, inputs.response_mask, **settings
        )
    if loss_type == "reinforce":
        corrected = replace(inputs, response_mask=mask, rollout_is_weights=weights)
        pg_loss, pg_metrics = compute_policy_loss_reinforce(corrected)
    else:
        corrected = replace(inputs, response_mask=mask, rollout_is_weights=None)
        pg_loss, pg_metrics = compute_policy_loss_vanilla(corrected, config)
    pg_metrics.update(metrics)
    return pg_loss, pg_metrics
