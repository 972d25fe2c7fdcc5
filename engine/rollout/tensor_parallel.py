"""One rollout engine spread over several ranks (``rollout.tensor_model_parallel_size > 1``).

Every rank of the trainer's world is handed its own share of the batch, but with tensor
parallelism the ranks of one group (``tp`` consecutive ranks: vLLM's ``external_launcher``
derives its groups from the world in that order) are one engine, each holding a shard of every
layer, and each of them must ask that engine for the same prompts. So, as verl's rollout
sharding manager does, :class:`TensorParallelShare` gathers the group's prompts on every rank of
it, in rank order, generates them all once, and hands each rank back the rows of its own share.
Weight sync needs nothing of it: every rank passes whole tensors to the model's ``load_weights``,
which keeps the shard of its tensor-parallel rank. On a CPU, vLLM's shared memory for a group
has a fixed name: :func:`cpu_engine_start` lets one engine over the same ranks start at a
time on a machine, and removes what killed ranks left.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist

from engine.data import DataProto


class TensorParallelShare:
    """Wrap a rollout so the ranks of a tensor-parallel group generate one batch together.

    ``group`` holds the ranks of this rank's engine (a gloo group: the prompts travel pickled,
    on the CPU); ``rollout`` is this rank's handle on that engine.
    """

    def __init__(self, rollout: Any, group: dist.ProcessGroup) -> None:
        self.rollout = rollout
        self.group = group

    def load_weights(self, weights: Any) -> Any:
        """Load the policy into the engine (every rank of the group passes whole tensors)."""
        return self.rollout.load_weights(weights)

    def generate_sequences(
        self,
        prompts: DataProto,
        *,
        max_new_tokens: int,
        sampling: dict[str, Any],
        generator: Any = None,
    ) -> DataProto:
        """Return the rollout of this rank's ``prompts``, generated with the group's prompts.

        The group's shares are gathered in rank order (they may differ in size, not in prompt
        width), the engine generates them all and this rank keeps its own rows, in its order.
        Its responses are as wide as the group's longest, the rest right-padding (as the
        controller pads every rank's rollout to the longest of all).
        """
        device = next(iter(prompts.batch.values())).device if prompts.batch else None
        shares = gather_shares(prompts, self.group)
        widths = [tuple(share.batch["input_ids"].shape[1:]) for share in shares]
        if len(set(widths)) > 1:
            raise ValueError(
                f"the ranks of one rollout engine hold prompts of widths {widths}; left-pad every "
                "rank's prompts to one width (the controller's shares of one batch have it)"
            )
        gathered = DataProto.concat(shares)
        gathered.meta_info = prompts.meta_info
        if device is not None:
            gathered.to(device)
        out = self.rollout.generate_sequences(
            gathered, max_new_tokens=max_new_tokens, sampling=sampling, generator=generator
        )
        start = sum(len(share) for share in shares[: dist.get_rank(self.group)])
        return out.slice(start, start + len(prompts))


def gather_shares(data: DataProto, group: dist.ProcessGroup) -> list[DataProto]:
    """Return every rank's ``data`` in ``group``, in rank order, its tensors on the CPU."""
    on_cpu = DataProto(
        {key: value.cpu() for key, value in data.batch.items()},
        data.non_tensor_batch,
        data.meta_info,
    )
    shares: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(shares, on_cpu, group=group)
    return shares


def tensor_parallel_group(size: int, key: str) -> dist.ProcessGroup | None:
    """Return this rank's group of ``size`` consecutive ranks (None when ``size`` is 1 or there
    is a single rank, whose engine is whole).

    Every rank of the default process group must call this together (each group is created on
    all ranks). ValueError naming ``key`` unless ``size`` divides the world size.
    """
    initialized = dist.is_available() and dist.is_initialized()
    world, rank = (dist.get_world_size(), dist.get_rank()) if initialized else (1, 0)
    if size == 1 or world == 1:
        return None
    if world % size:
        raise ValueError(
            f"{key}={size} must divide the {world} ranks of the actor (trainer.nnodes x "
            "trainer.n_gpus_per_node): each rollout engine is that many consecutive ranks"
        )
    mine = None
    for start in range(0, world, size):
        group = dist.new_group(list(range(start, start + size)), backend="gloo")
        if start <= rank < start + size:
            mine = group
    return mine


def engine_seed(seed: int, rank: int, tensor_parallel_size: int) -> int:
    """Return the sampling seed of ``rank``'s engine: the ranks of one engine share it (each runs
    the engine's sampler and must draw the same tokens), engines differ."""
    return seed + rank // tensor_parallel_size


# How long one engine's start waits for another's over the same ranks on this machine; an
# engine on the tiny model starts in seconds, a 7B model's CPU engine in a few minutes.
START_WAIT_SECONDS = 900.0


@contextlib.contextmanager
def cpu_engine_start(
    tensor_parallel_size: int, folder: str = "/dev/shm", wait_seconds: float = START_WAIT_SECONDS
) -> Iterator[None]:
    """Start a CPU engine over this rank's tensor-parallel group: one start at a time per machine.

    vLLM's CPU build joins the ranks of a tensor-parallel group through shared memory named
    after the group and the engine's init method, which under ``external_launcher`` is always
    ``env://``: every engine over the same ranks uses the same names (``-tp:0-[0-1]-cpushm_<i>``
    in ``/dev/shm``), created exclusively. So two runs on one machine whose engines start
    together fail (``create shm in SHMManager failed. errno: 17``), and so does the start after
    ranks that were killed (Ray ends its actors so at shutdown) left their memory behind.

    The group's first rank takes an advisory lock named after the group's ranks in ``folder``
    (the kernel drops it when the process ends, killed or not), removes the names any earlier
    engine left (an engine still running keeps its mapping), and holds the lock until every rank
    of the world has built its engine, so the names are made by one engine at a time. Every rank
    of the world enters this together and runs the engine's construction inside it. A lock held
    longer than ``wait_seconds`` raises, naming the lock's file.
    """
    rank = dist.get_rank()
    first = rank - rank % tensor_parallel_size
    ranks = "-".join(str(r) for r in range(first, first + tensor_parallel_size))
    lock = None
    problem = ""
    if rank == first and os.path.isdir(folder):
        try:
            lock = _take_lock(os.path.join(folder, f"posttrain-vllm-[{ranks}].lock"), wait_seconds)
        except TimeoutError as error:
            problem = str(error)
        else:
            _remove_group_memory(folder, ranks)
    problems: list[str] = [""] * dist.get_world_size()
    dist.all_gather_object(problems, problem)  # no rank builds while a first rank gave up
    try:
        if any(problems):
            raise TimeoutError(next(p for p in problems if p))
        yield
        dist.barrier()  # every rank has made and opened its shared memory
    finally:
        if lock is not None:
            os.close(lock)


def _take_lock(path: str, wait_seconds: float) -> int:
    """Return a file descriptor holding ``path``'s exclusive ``flock``; TimeoutError after
    ``wait_seconds``."""
    descriptor = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
    deadline = time.monotonic() + wait_seconds
    waiting = False
    while True:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return descriptor
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(descriptor)
                raise TimeoutError(
                    f"another vLLM engine over the same ranks on this machine held {path} for "
                    f"{wait_seconds:g} s while it started; the lock goes when its process "
                    f"ends: find that process with 'fuser {path}', or run this one elsewhere"
                ) from None
            if not waiting:
                print(f"note: waiting for another vLLM engine's start on this machine ({path})")
                waiting = True
            time.sleep(0.2)


def _remove_group_memory(folder: str, ranks: str) -> None:
    """Remove the shared memory of engines over ``ranks`` (``0-1``) that earlier starts left."""
    for name in os.listdir(folder):
        if "tp:" in name and f"-[{ranks}]-cpushm_" in name:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(folder, name))
