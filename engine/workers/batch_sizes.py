"""A rank's share of the batch sizes: verl's global sizes divided by the data-parallel ranks.

``ppo_mini_batch_size`` counts prompts over the whole group (times ``rollout.n`` samples each);
``*_micro_batch_size_per_gpu`` is already per rank. A global size that does not divide by the
rank count is refused here, in the one message every caller uses.
"""

from __future__ import annotations


def per_rank_size(global_size: int, world_size: int, key: str) -> int:
    """Return ``global_size / world_size``; ValueError naming ``key`` unless it divides."""
    if global_size % world_size:
        raise ValueError(
            f"{key} x rollout.n = {global_size} samples cannot be split evenly over "
            f"{world_size} data-parallel ranks; make it a multiple of trainer.nnodes x "
            "trainer.n_gpus_per_node"
        )
    return global_size // world_size


def micro_size(per_gpu: int | None, mini_batch_size: int) -> int:
    """Return the micro-batch: ``per_gpu`` when set, never more than the mini-batch."""
    return min(per_gpu or mini_batch_size, mini_batch_size)
