"""GPG's plain policy gradient, no ratio and no clip (``loss_mode=gpg``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.algorithms.policy_loss.base import PolicyLossInputs, register_policy_loss

if TYPE_CHECKING:
    from engine.algorithms.policy_loss.base import LossOutput
    from engine.config import ActorConfig


@register_policy_loss("gpg")
def compute_policy_loss_gpg(inputs: PolicyLossInputs, config: ActorConfig) -> LossOutput:
    """Return GPG's plain policy-gradient loss ``-logp * A``, with no ratio and no clip.

    Group Policy Gradient, Chu et al., arXiv 2504.02546. ``old_log_prob`` is unused and no
    config key is read; no metrics apply. Shapes: all ``(bs, L)``.
    """
    pg_losses = -inputs.log_prob * inputs.advantages  # (bs, L)
    return inputs.aggregate(pg_losses), {}
