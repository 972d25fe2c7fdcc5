"""Process groups and device meshes for the ranks of one worker group.

The controller asks rank 0 for its node address and a free port, then hands that address to
every rank, which joins a ``TCPStore`` there (rank 0 hosts it). Going through an explicit store
rather than ``MASTER_ADDR``/``MASTER_PORT`` environment variables keeps several worker groups
(a colocated pool and a separate critic pool) in one Ray job from reading each other's settings.
gloo serves CPU ranks, nccl CUDA ranks.
"""

from __future__ import annotations

import socket
from datetime import timedelta

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

BACKENDS = {"cpu": "gloo", "cuda": "nccl"}
DEFAULT_TIMEOUT = timedelta(minutes=30)


def backend_for(device_type: str) -> str:
    """Return the collective backend for a device type: gloo on CPU, nccl on CUDA."""
    if device_type not in BACKENDS:
        raise ValueError(
            f"no process-group backend for device {device_type!r}; "
            f"trainer.device must resolve to one of {', '.join(BACKENDS)}"
        )
    return BACKENDS[device_type]


def free_port() -> int:
    """Return a TCP port that is free on this node right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def node_address() -> str:
    """Return this node's IP address as the other nodes of the Ray cluster see it."""
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # outside a Ray worker: a single-node group
        return "127.0.0.1"


def init_process_group(
    *,
    rank: int,
    world_size: int,
    host: str,
    port: int,
    backend: str,
    timeout: timedelta = DEFAULT_TIMEOUT,
) -> None:
    """Join the default process group through a TCPStore at ``host:port`` (rank 0 hosts it)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of {world_size} ranks")
    if dist.is_initialized():
        raise RuntimeError("this process already belongs to a process group; use one per rank")
    store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)


def build_device_mesh(device_type: str, world_size: int, fsdp_size: int = -1) -> DeviceMesh:
    """Return the mesh FSDP2 shards over: 1-D, or 2-D ``(ddp, fsdp)`` (HSDP) for a smaller fsdp_size.

    ``fsdp_size`` is a role's ``fsdp_config.fsdp_size``: -1 (or the world size) shards over
    every rank; a divisor of the world size shards within groups of that many ranks and
    replicates across the groups.
    """
    if fsdp_size in (-1, world_size):
        return init_device_mesh(device_type, (world_size,), mesh_dim_names=("fsdp",))
    if fsdp_size <= 0 or world_size % fsdp_size:
        raise ValueError(
            f"fsdp_config.fsdp_size={fsdp_size} must be -1 or a divisor of the {world_size} ranks "
            "of the role's pool (trainer.nnodes x trainer.n_gpus_per_node, or reward_model.nnodes "
            "x reward_model.n_gpus_per_node for the reward model's own pool)"
        )
    return init_device_mesh(
        device_type, (world_size // fsdp_size, fsdp_size), mesh_dim_names=("ddp", "fsdp")
    )
