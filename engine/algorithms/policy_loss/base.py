"""What every policy loss shares: the registry by ``actor.policy_loss.loss_mode`` and the call.

Every loss takes ``(old_log_prob, log_prob, advantages, response_mask)``, all
``(bs, response_length)``, then ``loss_agg_mode`` and keyword hyper-parameters named like the
actor config keys with verl's defaults. Every loss accepts the PPO clip keys (``clip_ratio``,
``clip_ratio_low``, ``clip_ratio_high``, ``clip_ratio_c``), so one call site serves all modes;
mode-specific keys (``clip_cov_*``, ``kl_cov_ratio``, ``ppo_kl_coef``, ``tau_pos``,
``tau_neg``) belong to their mode only. Every loss takes ``rollout_is_weights`` (bs, L), the
rollout correction's truncated importance weights (``engine.algorithms.rollout_correction``),
and multiplies its token losses by them as verl does (``geo_mean``: their per-sequence
geometric mean).
Each returns ``(pg_loss, metrics)``: a scalar tensor with its graph, and a dict of floats under
verl's metric names, holding only the metrics that mean something for that loss.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.algorithms.names import POLICY_LOSS_MODES
from engine.algorithms.registry import Registry
from engine.algorithms.torch_functional import check_same_shape

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]

POLICY_LOSS_REGISTRY: Registry[PolicyLossFn] = Registry(
    POLICY_LOSS_MODES,
    kind="policy loss mode",
    plural="loss modes",
    listed_as="engine.algorithms.names.POLICY_LOSS_MODES",
    source="a module of engine/algorithms/policy_loss/",
)
# verl's names. A name is given as a string literal: names.POLICY_LOSS_MODES reads it from the
# package's modules.
register_policy_loss = POLICY_LOSS_REGISTRY.register
get_policy_loss_fn = POLICY_LOSS_REGISTRY.lookup


def clip_range(
    clip_ratio: float, clip_ratio_low: float | None, clip_ratio_high: float | None
) -> tuple[float, float]:
    """Return ``(low, high)``, each falling back to ``clip_ratio`` when None."""
    low = clip_ratio if clip_ratio_low is None else clip_ratio_low
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    return low, high


def check_inputs(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
) -> None:
    """Raise ValueError unless the four ``(bs, L)`` inputs of a policy loss share one shape."""
    check_same_shape(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
    )


def weighted(pg_losses: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    """Return the ``(bs, L)`` token losses times the rollout-correction IS weights, if any."""
    return pg_losses if rollout_is_weights is None else pg_losses * rollout_is_weights
