"""The critic's clipped value loss and the policy's entropy, aggregated like the policy loss.

The value loss clips the new prediction to within ``cliprange_value`` of the value recorded at
rollout time and keeps the larger of the two squared errors, as PPO does for the policy ratio
(PPO, arXiv 1707.06347; the value clip follows OpenAI baselines' ppo2, as verl does).
"""

from __future__ import annotations

import torch

from engine.algorithms.loss_aggregation import GlobalBatch, agg_loss
from engine.algorithms.torch_functional import (
    check_same_shape,
    clip_by_value,
    entropy_from_logits,
    masked_mean,
)


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    global_batch: GlobalBatch | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return the clipped value loss and the share of tokens where the clip bites.

    ``vf_loss = 0.5 * agg(max((v - R)^2, (clip(v, v_old - c, v_old + c) - R)^2))`` and
    ``vf_clipfrac = mean((clipped error) > (unclipped error))`` over the masked tokens;
    ``global_batch``: the mini-batch's counts ``agg`` normalises by (None: these tokens').
    Shapes: vpreds, returns, values, response_mask ``(bs, L)`` -> two scalars.
    """
    check_same_shape(vpreds=vpreds, returns=returns, values=values, response_mask=response_mask)
    vpredclipped = clip_by_value(vpreds, values - cliprange_value, values + cliprange_value)
    vf_losses1 = (vpreds - returns) ** 2  # (bs, L)
    vf_losses2 = (vpredclipped - returns) ** 2  # (bs, L)
    clipped_vf_losses = torch.max(vf_losses1, vf_losses2)  # (bs, L)
    vf_loss = 0.5 * agg_loss(clipped_vf_losses, response_mask, loss_agg_mode, global_batch)
    vf_clipfrac = masked_mean(torch.gt(vf_losses2, vf_losses1).float(), response_mask)
    return vf_loss, vf_clipfrac


def compute_entropy_loss(
    logits: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str = "token-mean"
) -> torch.Tensor:
    """Return the aggregated entropy of the policy's token distributions (a scalar).

    The actor subtracts ``entropy_coeff`` times this from its loss as an exploration bonus.
    Shapes: logits ``(bs, L, vocab)``, response_mask ``(bs, L)`` -> scalar.
    """
    if tuple(logits.shape[:-1]) != tuple(response_mask.shape):
        raise ValueError(
            f"logits has shape {tuple(logits.shape)} and response_mask has shape "
            f"{tuple(response_mask.shape)}; the mask must match the logits without the vocabulary."
        )
    token_entropy = entropy_from_logits(logits)  # (bs, L)
    return agg_loss(token_entropy, response_mask, loss_agg_mode)
