"""The asynchronous trainers on the Ray controller: one-step-off and fully-async over worker
groups of FSDP2 ranks (``trainer.controller=ray`` with ``actor_rollout_ref.hybrid_engine=False``).

verl runs its one-step-off and fully-async trainers on Ray only; here each loop is written once
(``engine.trainer.one_step_off``, ``engine.trainer.fully_async``) and these classes put it over
``RayPPOTrainer``'s workers: the update, the reference and pi_old run on the sharded ranks (an
update that weighs itself from its own pi_old hands the ranks' IS weights back), the
rollout in the one rollout worker process beside the driver, as under the local controller. A
weight sync gathers the ranks' shards on rank 0 (``ActorRolloutRefGroup.full_state_dict``) and
sends the whole copy to the worker, and the worker builds its weightless copy from rank 0's
model config (``policy_skeleton``). The ranks' own rollout serves validation only. Checkpoints
are the ranks' shards, as ``RayPPOTrainer``'s; the batches in flight are not in them, as under
the local controller.
"""

from __future__ import annotations

from engine.trainer.fully_async import FullyAsyncPPOTrainer
from engine.trainer.one_step_off import OneStepOffPPOTrainer
from engine.trainer.ray_trainer import RayPPOTrainer


class RayOneStepOffPPOTrainer(OneStepOffPPOTrainer, RayPPOTrainer):
    """The one-step-off loop over Ray worker groups (see the module doc)."""


class RayFullyAsyncPPOTrainer(FullyAsyncPPOTrainer, RayPPOTrainer):
    """The fully-async loop over Ray worker groups (see the module doc)."""
