"""What every policy loss shares: its inputs, its call and the registry by ``loss_mode``.

A loss is called as ``get_policy_loss_fn(actor.policy_loss.loss_mode)(inputs, config)``, verl's
``policy_loss_fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
rollout_is_weights)`` with the per-micro-batch part written once, in :class:`PolicyLossInputs`:
the four ``(bs, response_length)`` tensors, the aggregation mode, the rollout correction's
importance weights and the global batch the trainer normalises over. ``config`` is the actor's
section (``actor_rollout_ref.actor``, :class:`engine.config.ActorConfig`), as verl passes its
``ActorConfig``: each loss reads its own keys from it and names them in its docstring, so the
actor calls every loss the same way and a loss that reads existing keys touches nothing outside
its module.

Each loss returns ``(pg_loss, metrics)``: a scalar tensor with its graph, and a dict of floats
under verl's metric names, holding only the metrics that mean something for that loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.algorithms.loss_aggregation import GlobalBatch, agg_loss
from engine.algorithms.names import POLICY_LOSS_MODES
from engine.algorithms.registry import Registry
from engine.algorithms.torch_functional import check_same_shape

if TYPE_CHECKING:
    from engine.config import ActorConfig


@dataclass(frozen=True)
class PolicyLossInputs:
    """One micro-batch's inputs to a policy loss; every tensor ``(bs, response_length)``.

    ``old_log_prob`` and ``log_prob``: each response token's log-prob under the policy that
    sampled it (in bypass mode, the rollout's) and under the policy being trained;
    ``advantages``; ``response_mask`` (1 on response tokens). ``loss_agg_mode``: how token losses
    are averaged (``actor.loss_agg_mode``). ``rollout_is_weights``: the rollout correction's
    truncated importance weights (``engine.algorithms.rollout_correction``), which multiply the
    token losses as in verl; None: none. ``global_batch``: the mini-batch's counts that
    :func:`~engine.algorithms.loss_aggregation.agg_loss` normalises by; None: this micro-batch's
    own. Raises ValueError when the four tensors' shapes differ.
    """

    old_log_prob: torch.Tensor
    log_prob: torch.Tensor
    advantages: torch.Tensor
    response_mask: torch.Tensor
    loss_agg_mode: str = "token-mean"
    rollout_is_weights: torch.Tensor | None = None
    global_batch: GlobalBatch | None = None

    def __post_init__(self) -> None:
        check_same_shape(
            old_log_prob=self.old_log_prob,
            log_prob=self.log_prob,
            advantages=self.advantages,
            response_mask=self.response_mask,
        )

    def aggregate(self, pg_losses: torch.Tensor, loss_agg_mode: str | None = None) -> torch.Tensor:
        """Return the ``(bs, L)`` token losses times the IS weights (when there are any),
        aggregated over the response mask and the global batch by ``loss_agg_mode`` (None: the
        inputs' own)."""
        if self.rollout_is_weights is not None:
            pg_losses = pg_losses * self.rollout_is_weights  # (bs, L)
        mode = loss_agg_mode or self.loss_agg_mode
        return agg_loss(pg_losses, self.response_mask, mode, self.global_batch)


# A loss's result: the scalar loss with its graph, and its metrics under verl's names.
LossOutput = tuple[torch.Tensor, dict[str, float]]
PolicyLossFn = Callable[[PolicyLossInputs, "ActorConfig"], LossOutput]

# verl's names. A name is given as a string literal: names.POLICY_LOSS_MODES reads it from the
# package's modules.
POLICY_LOSS_REGISTRY: Registry[PolicyLossFn] = Registry(
    POLICY_LOSS_MODES, "policy loss mode", "loss modes", "POLICY_LOSS_MODES", "policy_loss/"
)
register_policy_loss = POLICY_LOSS_REGISTRY.register
get_policy_loss_fn = POLICY_LOSS_REGISTRY.lookup


def clip_range(config: ActorConfig) -> tuple[float, float]:
    """Return the clip range ``(low, high)``: ``clip_ratio_low`` and ``clip_ratio_high``, each
    falling back to ``clip_ratio`` when None."""
    low = config.clip_ratio if config.clip_ratio_low is None else config.clip_ratio_low
    high = config.clip_ratio if config.clip_ratio_high is None else config.clip_ratio_high
    return low, high
