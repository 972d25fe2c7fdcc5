"""A rank's share of the batch sizes: verl's global sizes divided by the data-parallel ranks.

``ppo_mini_batch_size`` counts prompts over the whole group (times ``rollout.n`` samples each);
``*_micro_batch_size_per_gpu`` is already per rank. A global size that does not divide by the
rank count is refused here, in the one message every caller uses.

The loss of a micro-batch is normalised by counts over its whole mini-batch on every rank
(:func:`global_batch`), so the gradient does not depend on how the mini-batch was split.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from engine.algorithms.loss_aggregation import GlobalBatch

if TYPE_CHECKING:
    from engine.config import ActorConfig, CriticConfig


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


def data_parallel_size() -> int:
    """Return the ranks of the default process group (1 when torch.distributed is not set up).

    A rank's workers train in the default group (``RankWorker`` joins one per pool), and FSDP2
    averages gradients over it.
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def global_batch(
    response_mask: torch.Tensor,
    loss_scale_factor: float | None,
    norm_times_dp: bool = False,
    sequence_parallel_size: int = 1,
) -> GlobalBatch:
    """Return the mini-batch's counts for :func:`~engine.algorithms.loss_aggregation.agg_loss`.

    ``response_mask`` (bs, R) is this rank's whole mini-batch; its valid tokens and the rows with
    one are summed over the data-parallel ranks with one all-reduce when there are several (as
    verl's FSDP engine sums ``batch_num_tokens``); one rank's counts are its own.
    ``norm_times_dp``: the role's ``seq_mean_token_sum_norm_times_dp``. With Ulysses
    (``sequence_parallel_size`` > 1) the ranks of a sequence-parallel group hold the same
    mini-batch: the data-parallel size is ranks / sequence_parallel_size and each group's counts
    are counted once.
    """
    counts = torch.stack(
        [response_mask.sum(), (response_mask.sum(-1) > 0).sum()]
    ).double()  # (2,) tokens, sequences
    world = data_parallel_size()
    if world > 1:
        dist.all_reduce(counts, op=dist.ReduceOp.SUM)
    dp_size = world // sequence_parallel_size
    tokens, sequences = (counts / sequence_parallel_size).tolist()
    return GlobalBatch(tokens, sequences, dp_size, loss_scale_factor, norm_times_dp)


def epoch_batches(data: Any, config: ActorConfig | CriticConfig) -> Iterator[Any]:
    """Yield the batch once per PPO epoch (``config.ppo_epochs``), as each epoch visits it.

    With ``config.shuffle`` and more than one epoch the rows are permuted each epoch by one
    generator seeded from ``config.data_loader_seed``, as verl's actor and critic shuffle their
    mini-batches; otherwise every epoch sees the batch in order.
    """
    if config.ppo_epochs is None:  # only the critic's may be: null follows the actor's
        raise ValueError(
            "critic.ppo_epochs is null; set it, or resolve the config (resolve_config) so it takes "
            "actor_rollout_ref.actor.ppo_epochs"
        )
    epochs = int(config.ppo_epochs)
    if not (getattr(config, "shuffle", False) and epochs > 1):
        for _ in range(epochs):
            yield data
        return
    generator = torch.Generator().manual_seed(int(getattr(config, "data_loader_seed", 42)))
    for _ in range(epochs):
        yield data[torch.randperm(len(data), generator=generator)]
