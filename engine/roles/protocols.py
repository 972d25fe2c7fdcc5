"""The interfaces the single controller drives: one role object per verl role, whoever hosts it.

The trainer holds an :class:`ActorRolloutRef` and, when a value model trains, a :class:`Critic`.
In one process on a CPU they are the plain workers (``ActorRolloutRefWorker``,
``CriticWorker``); on a CUDA device or over Ray they are the proxies of a worker group
(``engine.distributed.worker_group``) whose ranks host FSDP2-sharded workers. Both sides keep
these method names; the type checker holds them to it.

A :class:`RolloutEngine` turns prompts into responses (``engine.rollout``'s backends).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from engine.data import DataProto

if TYPE_CHECKING:
    from engine.roles.model_loading import PolicySkeleton


@runtime_checkable
class ActorRolloutRef(Protocol):
    """The policy, its rollout and the reference policy (verl's fused actor-rollout-ref role)."""

    def generate_sequences(self, prompts: DataProto, *, validate: bool = False) -> DataProto:
        """Return responses for prompts already repeated ``rollout.n`` times."""
        ...

    def needs_old_log_prob(self, batch_size: int) -> bool:
        """Return False when the update is on-policy and old log-probs equal the current ones."""
        ...

    def compute_log_prob(self, data: DataProto) -> DataProto:
        """Return ``old_log_probs`` and ``entropys`` (bs, R)."""
        ...

    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """Return ``ref_log_prob`` (bs, R)."""
        ...

    def update_actor(self, data: DataProto) -> dict[str, float]:
        """Run the policy update on the batch; return its metrics."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Return what a checkpoint needs to continue exactly."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`."""
        ...

    def export_hf(self, directory: str | Path) -> Path | None:
        """Save the policy as a Hugging Face folder."""
        ...

    def policy_skeleton(self) -> PolicySkeleton:
        """Return the policy's config, generation config and dtype (a rollout worker's copy)."""
        ...

    def full_state_dict(self) -> dict[str, Any]:
        """Return the policy's whole weights as CPU tensors (what a rollout worker loads)."""
        ...


@runtime_checkable
class Critic(Protocol):
    """The value model (GAE)."""

    def compute_values(self, data: DataProto) -> DataProto:
        """Return ``values`` (bs, R)."""
        ...

    def update_critic(self, data: DataProto) -> dict[str, float]:
        """Run the value update on the batch; return its metrics."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Return what a checkpoint needs to continue exactly."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`."""
        ...


@runtime_checkable
class RolloutEngine(Protocol):
    """A generation backend: left-padded prompt ids in, response tensors and log-probs out."""

    def load_weights(self, model: Any) -> Any:
        """Take the policy's current weights (the module itself, or gathered parameters)."""
        ...

    def generate_sequences(
        self,
        prompts: DataProto,
        *,
        max_new_tokens: int,
        sampling: dict[str, Any],
        generator: Any = None,
    ) -> DataProto:
        """Return ``responses``, ``response_mask``, ``rollout_log_probs`` and the full rows."""
        ...
