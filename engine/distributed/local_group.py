"""A one-rank worker group in the controller's own process: verl's FSDP workers on one GPU, no Ray.

On a CUDA device the single-process trainer trains as a one-GPU verl run does: the policy and
reference are FSDP2 modules (bf16 compute, fp32 master weights and gradient reduction, as
``fsdp_config.mixed_precision`` says) on a process group of one rank over NCCL, and the ``hf``
rollout samples from a bf16 copy refreshed from the sharded weights. It is the Ray path's rank
(:class:`~engine.distributed.rank_worker.RankWorker`) and controller-side proxies
(:class:`~engine.distributed.worker_group.ActorRolloutRefGroup`, ``CriticGroup``) with the
dispatch done by a plain method call instead of a pickled frame, so both paths run one code.
Batches go to the device and results come back to the CPU as on a Ray rank, but nothing is
pickled: a result already on the CPU (a CPU rank's gathered weights) is the rank's own tensor.

The process group is the process's default group: made on first use (a TCPStore on a free
loopback port) and kept, so a second trainer in the same process reuses it. A process that
already belongs to a larger group cannot host a one-rank trainer; that is refused with the fix.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from engine.data import DataProto
from engine.distributed.process_group import backend_for, free_port, init_process_group


def join_local_process_group(device_type: str) -> None:
    """Make this process rank 0 of a one-rank default group, unless it already is."""
    backend = backend_for(device_type)
    if dist.is_initialized():
        if dist.get_world_size() != 1:
            raise RuntimeError(
                f"this process is one of {dist.get_world_size()} ranks of a process group; the "
                "single-process trainer hosts its own one-rank group. Use trainer.controller=ray "
                "for several ranks, or start the trainer outside torch.distributed"
            )
        if dist.get_backend() != backend:
            raise RuntimeError(
                f"this process's group uses {dist.get_backend()}, but a {device_type} trainer "
                f"needs {backend}; destroy the group first (torch.distributed."
                "destroy_process_group())"
            )
        return
    init_process_group(rank=0, world_size=1, host="127.0.0.1", port=free_port(), backend=backend)


class LocalWorkerGroup:
    """One in-process :class:`RankWorker` with :class:`RayWorkerGroup`'s dispatch methods."""

    world_size = 1

    def __init__(self, device_type: str) -> None:
        from engine.distributed.rank_worker import RankWorker

        join_local_process_group(device_type)
        self.worker = RankWorker(0, 1, device_type)

    def execute_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``RankWorker.method`` (``build_role`` or ``call``); return it as a one-item list."""
        if method not in ("build_role", "call"):
            raise ValueError(f"{method!r} is not one of build_role, call")
        return [getattr(self.worker, method)(*args, **kwargs)]

    def call_all(self, role: str, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``role.method`` on the rank (ONE_TO_ALL)."""
        return self.execute_all("call", role, method, *args, **kwargs)

    def call_each(self, role: str, method: str, per_rank_args: list[tuple]) -> list[Any]:
        """Call ``role.method`` with ``per_rank_args[0]``."""
        if len(per_rank_args) != 1:
            raise ValueError(f"expected 1 argument tuple, got {len(per_rank_args)}")
        return self.call_all(role, method, *per_rank_args[0])

    def call_split(
        self,
        role: str,
        method: str,
        data: DataProto,
        *,
        pad: bool = True,
        sequence_parallel: int = 1,
        **kwargs: Any,
    ) -> tuple[list[Any], int]:
        """Call ``role.method`` on the whole batch (one rank: no split, no padding)."""
        return self.call_all(role, method, data, **kwargs), 0

    def shutdown(self) -> None:
        """Drop the roles (and their GPU memory); the process group stays for reuse."""
        self.worker.roles.clear()
        if self.worker.channel is not None:
            self.worker.channel.close()
