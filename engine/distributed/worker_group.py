"""Resource pools, Ray worker groups and the proxies the controller calls instead of local workers.

A :class:`ResourcePool` is ``trainer.nnodes`` x ``trainer.n_gpus_per_node`` rank slots (a GPU
each, or CPU slots when ``trainer.device=cpu``), reserved as one Ray placement group with one
bundle per node holding that node's slots. ``nnodes`` counts machines, as in verl: the bundles
are placed ``STRICT_SPREAD``, each on a different Ray node, even where one node could hold them
all (CPU ranks, a big GPU node). A :class:`RayWorkerGroup` starts one
:class:`~engine.distributed.rank_worker.RankWorker` actor per slot and joins them in a process
group; the roles mapped to the pool are built on every rank (by default one shared pool: actor,
rollout, reference and critic colocated).

A rank whose process dies, alone or with its node, ends the call with :class:`RankDiedError`
naming the rank, its pid and its node (id, address, custom resources) and whether the node died:
Ray marks a node dead some seconds after it stops answering (about 15 s by default), so the
group waits up to ``NODE_DEATH_WAIT_S`` for Ray's verdict before raising.

The proxies :class:`ActorRolloutRefGroup` and :class:`CriticGroup` expose the local workers'
method names, so the single-process loop drives them unchanged; :class:`RewardModelGroup` is
``RewardModelScorer.score`` over the reward model's ranks, handed to the reward manager in place
of a scorer. Two dispatch modes, as verl's:

- split (``DP_COMPUTE_PROTO``): the batch is padded to a multiple of the rank count (rows
  repeated from its start), cut into equal contiguous chunks, one per rank; the results are
  concatenated in rank order and the padding dropped. Updates refuse padding instead (a
  repeated row would count twice in the gradient) and need a batch that divides evenly.
  With Ulysses sequence parallelism (a role's ``ulysses_sequence_parallel_size`` sp > 1) the
  batch is cut into ranks / sp chunks, each given to the sp consecutive ranks of one
  sequence-parallel group, and each group's first rank's result is kept (verl's dispatch over its
  ``(dp, sp)`` mesh).
- all (``ONE_TO_ALL``): the same call on every rank (state dicts, export).

A training rollout call also runs the reference pass on each rank over the sequences it just
sampled, and the proxy's ``compute_ref_log_prob`` hands that result out instead of calling the
ranks again: a GRPO step is two calls (rollout, update), not three.

Calls to the roles travel over the group's direct connection to each rank
(:mod:`engine.distributed.channel`), or as Ray actor calls with ``POSTTRAIN_RANK_CHANNEL=0``; Ray
starts the ranks, joins them in the process group and kills them.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from engine.algorithms.rollout_correction import IS_IN_UPDATE
from engine.data import DataProto
from engine.distributed import channel
from engine.distributed.channel import RankChannelError, RankChannels, pack, result_of
from engine.env import CPU_PROCESS_ENV
from engine.perf import reduce_rank_metrics

if TYPE_CHECKING:
    from engine.config import PPOConfig
    from engine.roles.model_loading import PolicySkeleton

PLACEMENT_TIMEOUT_S = 120
# Ray's default node health check gives up on a node after 5 missed checks 3 s apart.
NODE_DEATH_WAIT_S = 30.0
# Ray's own resources of every node; the others are the operator's (``--resources``).
RAY_NODE_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")
# Placement group names must be unique in the cluster: two groups of one process differ here.
GROUP_IDS = itertools.count()


@dataclass(frozen=True)
class ResourcePool:
    """Rank slots for one worker group: ``process_on_nodes[i]`` ranks on node ``i``.

    Each slot reserves ``cpus_per_rank`` CPUs (and a GPU on ``cuda``); a CPU rank runs that many
    torch threads (at least one).
    """

    name: str
    process_on_nodes: tuple[int, ...]
    device_type: str = "cpu"
    cpus_per_rank: float = 1.0

    @property
    def world_size(self) -> int:
        """Return the number of ranks."""
        return sum(self.process_on_nodes)

    def bundle(self) -> dict[str, float]:
        """Return the Ray resources of one rank slot."""
        if self.device_type == "cuda":
            return {"CPU": self.cpus_per_rank, "GPU": 1.0}
        return {"CPU": self.cpus_per_rank}

    def node_bundles(self) -> list[dict[str, float]]:
        """Return one placement-group bundle per node: the resources of all its rank slots."""
        return [
            {key: value * count for key, value in self.bundle().items()}
            for count in self.process_on_nodes
        ]


class RankDiedError(RankChannelError):
    """A rank process died, alone or with its node; the message names the rank and its node."""


def describe_node(node: dict[str, Any]) -> str:
    """Return ``<address>, head, resources a, b`` for an entry of ``ray.nodes()``."""
    resources = node.get("Resources", {})
    custom = sorted(
        key
        for key in resources
        if key not in RAY_NODE_RESOURCES and not key.startswith(("node:", "accelerator_type:"))
    )
    parts = [node.get("NodeManagerAddress", "?")]
    if "node:__internal_head__" in resources:
        parts.append("head")
    if custom:
        parts.append("resources " + ", ".join(custom))
    return ", ".join(parts)


def node_death(node_id: str) -> str | None:
    """Return why Ray marked node ``node_id`` dead, or None while it counts it alive."""
    import ray

    for node in ray.nodes():
        if node["NodeID"] == node_id and not node["Alive"]:
            return node.get("DeathReasonMessage") or "no reason given"
    return None


def init_ray(ray_init: Any) -> None:
    """Connect to ``ray_init.address``, ``RAY_ADDRESS`` or ``POSTTRAIN_RAY_HEAD``, else do as verl:
    join this machine's ``ray start`` head or start a local cluster."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", CPU_PROCESS_ENV["RAY_AUTH_MODE"])
    address = (
        getattr(ray_init, "address", None)
        or os.environ.get("RAY_ADDRESS")
        or os.environ.get("POSTTRAIN_RAY_HEAD")
    )
    if address:
        ray.init(address=address)
        return
    # No address, as verl calls it: Ray joins the head that `ray start` last started on this
    # machine (how a verl user's multi-node launch finds its cluster), else starts a local one.
    # address="auto" would also join heads started by other processes' ray.init, and die with them.
    ray.init(
        num_cpus=getattr(ray_init, "num_cpus", None),
        include_dashboard=bool(getattr(ray_init, "include_dashboard", False)),
    )


def resolve_worker_device(device: str) -> str:
    """Return the ranks' device type for ``trainer.device`` from the Ray cluster's resources."""
    import ray

    gpus = ray.cluster_resources().get("GPU", 0)
    if device == "auto":
        return "cuda" if gpus >= 1 else "cpu"
    if device == "cuda" and gpus < 1:
        raise RuntimeError(
            "trainer.device=cuda but the Ray cluster has no GPU; use trainer.device=cpu (ranks "
            "then count CPU slots) or join a GPU cluster with RAY_ADDRESS"
        )
    if device not in ("cpu", "cuda"):
        raise ValueError(f"trainer.device={device!r} is not one of auto, cpu, cuda")
    return device


def split_batch(data: DataProto, world_size: int, *, pad: bool) -> tuple[list[DataProto], int]:
    """Return ``world_size`` equal contiguous chunks of ``data`` and the rows of padding added."""
    if not pad and len(data) % world_size:
        raise ValueError(
            f"a batch of {len(data)} samples cannot be split evenly over {world_size} ranks for "
            "an update; make data.train_batch_size x rollout.n a multiple of trainer.nnodes x "
            "trainer.n_gpus_per_node"
        )
    padded, pad_size = data.pad_to_divisor(world_size)
    return padded.chunk(world_size), pad_size


def split_rows(rows: Sequence[Any], world_size: int) -> tuple[list[list[Any]], int]:
    """Return ``world_size`` equal contiguous chunks of ``rows`` and the rows of padding added.

    ``split_batch`` for a plain list: padded to a multiple of ``world_size`` with rows repeated
    from its start, so the results concatenated in rank order, less the last ``pad_size``
    entries, are the rows' results in order.
    """
    if not rows:
        raise ValueError("cannot split an empty list of rows: there are no rows to repeat")
    pad_size = -len(rows) % world_size
    padded = [*rows, *(rows[i % len(rows)] for i in range(pad_size))]
    share = len(padded) // world_size
    return [padded[rank * share : (rank + 1) * share] for rank in range(world_size)], pad_size


def gather_batches(outputs: list[DataProto], pad_size: int) -> DataProto:
    """Concatenate per-rank outputs in rank order and drop the padding rows at the end.

    ``timing_s/*`` meta values become the slowest rank's; other meta_info is rank 0's.
    """
    merged = DataProto.concat(outputs).unpad(pad_size)
    meta = dict(outputs[0].meta_info)
    for key in meta:
        if key.startswith("timing_s/"):
            meta[key] = max(float(out.meta_info.get(key, 0.0)) for out in outputs)
    merged.meta_info = meta
    return merged


# Rollout columns whose width is the response length T (or P + T), and their padding values;
# position ids are recomputed from the padded attention mask, as the rollout computes them.
RESPONSE_PADDING = {
    "responses": None,
    "response_mask": 0,
    "rollout_log_probs": 0.0,
    "ref_log_prob": 0.0,
}
SEQUENCE_PADDING = {"input_ids": None, "attention_mask": 0}


def pad_rollouts(outputs: list[DataProto], pad_token_id: int) -> list[DataProto]:
    """Right-pad every rank's rollout to the longest response among the ranks.

    Each rank stops sampling when its own sequences have ended, so ``responses`` (bs, T_rank)
    differ in width. Padding tokens are ``pad_token_id`` with mask 0 and log-prob 0, exactly
    what a single rollout of the whole batch puts after a response that ended early.
    """
    width = max(out.batch["responses"].shape[1] for out in outputs)
    padded = []
    for out in outputs:
        extra = width - out.batch["responses"].shape[1]
        if extra == 0:
            padded.append(out)
            continue
        batch = dict(out.batch)
        for key, value in {**RESPONSE_PADDING, **SEQUENCE_PADDING}.items():
            if key in batch:
                fill = pad_token_id if value is None else value
                batch[key] = torch.nn.functional.pad(batch[key], (0, extra), value=fill)
        if "position_ids" in batch:
            batch["position_ids"] = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
        padded.append(DataProto(batch, out.non_tensor_batch, out.meta_info))
    for key in outputs[0].batch:
        widths = {tuple(out.batch[key].shape[1:]) for out in padded}
        if len(widths) > 1:
            raise ValueError(
                f"rollout column {key!r} has different widths on different ranks {sorted(widths)} "
                "and no known padding; add it to RESPONSE_PADDING or SEQUENCE_PADDING"
            )
    return padded


def tensors_only(data: DataProto) -> DataProto:
    """Return ``data`` without its per-row Python objects (prompts, reward specs, uids).

    Log-prob, value and update calls read tensors only; pickling every row's dicts and strings
    to the ranks and back cost more than the tensors themselves.
    """
    return data.select(non_tensor_batch_keys=[])


class WorkerGroup(Protocol):
    """What the role proxies need of a group of ranks: a Ray group, or one rank in process."""

    @property
    def world_size(self) -> int: ...

    def execute_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]: ...

    def call_all(self, role: str, method: str, *args: Any, **kwargs: Any) -> list[Any]: ...

    def call_each(self, role: str, method: str, per_rank_args: list[tuple]) -> list[Any]: ...

    def call_split(
        self,
        role: str,
        method: str,
        data: DataProto,
        *,
        pad: bool = True,
        sequence_parallel: int = 1,
        **kwargs: Any,
    ) -> tuple[list[Any], int]: ...


class RayWorkerGroup:
    """One Ray actor per rank of a resource pool, joined in one process group."""

    def __init__(self, pool: ResourcePool, *, env_vars: dict[str, str] | None = None) -> None:
        import ray
        from ray.util.placement_group import placement_group, placement_group_table
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from engine.distributed.rank_worker import RankWorker

        self.pool = pool
        nodes = len(pool.process_on_nodes)
        group = placement_group(
            pool.node_bundles(),
            strategy="STRICT_SPREAD" if nodes > 1 else "STRICT_PACK",
            name=f"{pool.name}_{os.getpid()}_{next(GROUP_IDS)}",
        )
        self.placement_groups: list[Any] = [group]
        done, _ = ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not done:
            alive = sum(1 for node in ray.nodes() if node["Alive"])
            self.shutdown()
            raise RuntimeError(
                f"the Ray cluster cannot host resource pool {pool.name!r}: it needs "
                f"{pool.world_size} slots of {pool.bundle()} ({list(pool.process_on_nodes)} per "
                f"node, on {nodes} different nodes) but has {ray.available_resources()} free on "
                f"{alive} nodes; lower trainer.n_gpus_per_node / trainer.nnodes or add resources "
                "or nodes (ray_init.num_cpus on a CPU machine)"
            )
        env = dict(CPU_PROCESS_ENV if pool.device_type == "cpu" else {})
        if pool.device_type == "cpu":  # as many torch threads as the CPUs the rank reserves
            threads = str(max(1, int(pool.cpus_per_rank)))
            env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
        env.pop("RAY_AUTH_MODE", None)
        env.update(env_vars or {})
        remote: Any = ray.remote(RankWorker)
        self.workers: list[Any] = []
        # Each rank takes its share of its node's bundle.
        bundle_node_ids = placement_group_table(group)["bundles_to_node_id"]
        self.node_ids: list[str] = []
        for node, count in enumerate(pool.process_on_nodes):
            for _ in range(count):
                rank = len(self.workers)
                self.node_ids.append(bundle_node_ids[node])
                self.workers.append(
                    remote.options(
                        num_cpus=pool.cpus_per_rank,
                        num_gpus=1 if pool.device_type == "cuda" else 0,
                        scheduling_strategy=PlacementGroupSchedulingStrategy(
                            placement_group=group, placement_group_bundle_index=node
                        ),
                        runtime_env={"env_vars": env},
                    ).remote(rank, pool.world_size, pool.device_type)
                )
        # Described now: a dead node's entry in ray.nodes() lists no resources.
        self.nodes = {
            node["NodeID"]: describe_node(node)
            for node in ray.nodes()
            if node["NodeID"] in self.node_ids
        }
        host, port = ray.get(self.workers[0].free_address.remote())
        self.pids = ray.get([w.init_process_group.remote(host, port) for w in self.workers])
        self.rank_lost = False  # a rank died in a call through Ray (the channel has its own flag)
        self.channels: RankChannels | None = None
        if channel.enabled():
            try:
                endpoints = ray.get([w.open_channel.remote() for w in self.workers])
                self.channels = RankChannels(endpoints, self.pids)
            except BaseException:
                self.shutdown()
                raise

    @property
    def world_size(self) -> int:
        """Return the number of ranks."""
        return len(self.workers)

    def execute_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``RankWorker.method`` (``build_role`` or ``call``) on every rank with the same
        arguments; return each rank's result."""
        return self.dispatch([pack((method, args, kwargs))] * self.world_size)

    def call_all(self, role: str, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``role.method`` on every rank with the same arguments (ONE_TO_ALL)."""
        return self.execute_all("call", role, method, *args, **kwargs)

    def call_each(self, role: str, method: str, per_rank_args: list[tuple]) -> list[Any]:
        """Call ``role.method`` on rank ``i`` with ``per_rank_args[i]``."""
        if len(per_rank_args) != self.world_size:
            raise ValueError(
                f"expected {self.world_size} argument tuples, got {len(per_rank_args)}"
            )
        return self.dispatch([pack(("call", (role, method, *args), {})) for args in per_rank_args])

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
        """Give each rank its chunk of ``data`` (DP_COMPUTE_PROTO); return results and padding.

        ``sequence_parallel`` (sp): one chunk per group of sp consecutive ranks, all of which
        get it; the results are the groups' first ranks'.
        """
        chunks, pad_size = split_batch(data, self.world_size // sequence_parallel, pad=pad)
        requests = [pack(("call", (role, method, chunk), kwargs)) for chunk in chunks]
        replies = self.dispatch([r for r in requests for _ in range(sequence_parallel)])
        return replies[::sequence_parallel], pad_size

    def dispatch(self, requests: list[bytes]) -> list[Any]:
        """Send packed request ``i`` to rank ``i`` over the direct channel (or through Ray when it
        is off); return the results in rank order, raising a rank's error with its traceback,
        or :class:`RankDiedError` as soon as a rank's process is gone."""
        if self.channels is not None:
            try:
                return self.channels.call(requests)
            except RankChannelError as exc:
                if exc.rank is None:
                    raise
                raise self.rank_died(exc.rank, str(exc)) from exc
        import ray

        futures = [w.call_packed.remote(r) for w, r in zip(self.workers, requests, strict=True)]
        ranks = {future: rank for rank, future in enumerate(futures)}
        replies: dict[int, Any] = {}
        while ranks:  # as they come: a dead rank is named while the others wait for it
            (future,), _ = ray.wait(list(ranks), num_returns=1)
            rank = ranks.pop(future)
            try:
                replies[rank] = ray.get(future)
            except ray.exceptions.RayActorError as exc:
                self.rank_lost = True
                raise self.rank_died(rank, str(exc)) from exc
        return [result_of(replies[rank], rank, pid) for rank, pid in enumerate(self.pids)]

    def rank_died(self, rank: int, cause: str) -> RankDiedError:
        """Return the error for rank ``rank``, whose process is gone: its node, and whether the
        node died with it (Ray's verdict, awaited up to ``NODE_DEATH_WAIT_S``)."""
        node_id = self.node_ids[rank]
        where = f"rank {rank} (pid {self.pids[rank]}) on node {node_id} ({self.nodes[node_id]})"
        return RankDiedError(f"{where} {self._death_verdict(rank)}\n({cause})", rank)

    def _death_verdict(self, rank: int) -> str:
        import ray
        from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError

        node_id = self.node_ids[rank]
        deadline = time.monotonic() + NODE_DEATH_WAIT_S
        while time.monotonic() < deadline:
            try:
                ray.get(self.workers[rank].__ray_ready__.remote(), timeout=1)
                return "lost its connection to the controller, but its process still answers Ray"
            except ActorDiedError:
                if (reason := node_death(node_id)) is not None:
                    return f"died with its node ({reason}): the node left the Ray cluster"
                return (
                    "died: the rank process died (killed, out of memory or crashed; its output "
                    "is in the Ray session's worker logs); its node is alive"
                )
            except (RayActorError, GetTimeoutError):  # unreachable: its node may be going
                if (reason := node_death(node_id)) is not None:
                    return f"died with its node ({reason}): the node left the Ray cluster"
                time.sleep(0.5)
        return (
            f"died or is unreachable: Ray cannot reach its process and has not marked its node "
            f"dead after {NODE_DEATH_WAIT_S:.0f} s"
        )

    def shutdown(self) -> None:
        """Leave the process group, kill the actors and free the placement groups."""
        import ray
        from ray.util.placement_group import remove_placement_group

        channels = getattr(self, "channels", None)
        # After a rank died the others may sit in a collective waiting for it: kill them.
        graceful = not getattr(self, "rank_lost", False) and (
            channels is None or not channels.broken
        )
        if channels is not None:
            channels.close()
            self.channels = None
        workers = getattr(self, "workers", [])
        if workers and graceful:
            # A dead rank must not keep the others alive.
            with contextlib.suppress(Exception):
                ray.get([w.shutdown.remote() for w in workers], timeout=30)
        for worker in workers:
            ray.kill(worker)
        self.workers = []
        for group in self.placement_groups:
            remove_placement_group(group)
        self.placement_groups = []


class _RoleOnGroup:
    """A role built on every rank of a group, checkpointed as the ranks' own shards."""

    role: str
    group: WorkerGroup

    def state_dict(self) -> dict[str, Any]:
        """Return every rank's shards (a sharded checkpoint: no rank holds the whole model)."""
        ranks = self.group.call_all(self.role, "state_dict")
        return {"format": "fsdp2_sharded", "world_size": self.group.world_size, "ranks": ranks}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Give each rank back its shards from :meth:`state_dict`."""
        self.group.call_each(self.role, "load_state_dict", check_sharded(state, self.group))


class ActorRolloutRefGroup(_RoleOnGroup):
    """The controller's handle on the actor/rollout/reference ranks: ``ActorRolloutRefWorker``'s
    methods, each dispatched over the group."""

    role = "actor_rollout_ref"

    def __init__(
        self, group: WorkerGroup, config: PPOConfig, *, total_steps: int, need_ref: bool
    ) -> None:
        self.group = group
        self.config = config
        self.tokenizer = None
        self.need_ref = need_ref
        # The reference pass over the last training rollout, computed in the rollout call.
        self.pending_ref: tuple[torch.Tensor, DataProto] | None = None
        arr = config.actor_rollout_ref
        # Ulysses: ranks per sequence of the update / log-prob passes and of the reference's.
        self.actor_sp = arr.actor.ulysses_sequence_parallel_size
        self.ref_sp = arr.ref.ulysses_sequence_parallel_size
        group.execute_all(
            "build_role", self.role, config, total_steps=total_steps, need_ref=need_ref
        )
        self.pad_token_id: int = group.call_all(self.role, "pad_token_id")[0]

    def generate_sequences(self, prompts: DataProto, *, validate: bool = False) -> DataProto:
        """Return the rollout for prompts already repeated ``n`` times, generated on every rank.

        A training rollout also runs the reference pass on each rank, in the same call (nothing
        on the controller needs it before then, and every call to the ranks costs milliseconds
        of dispatch and wake-up); :meth:`compute_ref_log_prob` hands that result out.
        """
        # A split reference runs one group's rows on every rank of the group: not the rows each
        # rank just sampled, so it gets its own call.
        with_ref = self.need_ref and not validate and self.ref_sp == 1
        # A single-turn rollout reads the prompt tensors only; multi-turn reads the messages too.
        multi_turn = self.config.actor_rollout_ref.rollout.multi_turn.enable
        outputs, pad = self.group.call_split(
            self.role,
            "generate_sequences",
            prompts if multi_turn else tensors_only(prompts),
            validate=validate,
            with_ref=with_ref,
        )
        out = gather_batches(pad_rollouts(outputs, self.pad_token_id), pad)
        if with_ref:
            ref = out.pop(batch_keys=["ref_log_prob"], meta_info_keys=["timing_s/ref_in_rollout"])
            self.pending_ref = (out.batch["input_ids"], ref)
        return out

    def needs_old_log_prob(self, batch_size: int) -> bool:
        """Return False when the update is on-policy (decided on the whole batch, as locally)."""
        from engine.roles.actor import is_on_policy

        arr = self.config.actor_rollout_ref
        mini_batch_size = arr.actor.ppo_mini_batch_size * arr.rollout.n
        return not is_on_policy(arr.actor, batch_size, mini_batch_size)

    def compute_log_prob(self, data: DataProto) -> DataProto:
        """Return ``old_log_probs`` and ``entropys`` (bs, R)."""
        outputs = self.group.call_split(
            self.role, "compute_log_prob", tensors_only(data), sequence_parallel=self.actor_sp
        )
        return gather_batches(*outputs)

    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """Return ``ref_log_prob`` (bs, R): the one the rollout call computed for these
        sequences (its meta_info carries ``timing_s/ref_in_rollout``), else a call to the ranks."""
        pending, self.pending_ref = self.pending_ref, None
        if pending is not None and torch.equal(pending[0], data.batch["input_ids"]):
            return pending[1]
        outputs = self.group.call_split(
            self.role, "compute_ref_log_prob", tensors_only(data), sequence_parallel=self.ref_sp
        )
        return gather_batches(*outputs)

    def update_actor(self, data: DataProto) -> dict[str, float]:
        """Update the sharded policy on the whole batch; return metrics reduced over ranks as
        verl does (``engine.perf.reduce_rank_metrics``).

        An update that weighs itself from its own pi_old (the trainer's ``IS_IN_UPDATE``) hands
        each rank's IS weights back: ``rollout_is_weights`` (bs, R) joins ``data`` in row order,
        as an in-process actor's update adds it.
        """
        weighing = bool(data.meta_info.get(IS_IN_UPDATE))
        outputs, _ = self.group.call_split(
            self.role,
            "update_actor_weighing" if weighing else "update_actor",
            tensors_only(data),
            pad=False,
            sequence_parallel=self.actor_sp,
        )
        if not weighing:
            return reduce_rank_metrics(outputs)
        weights = torch.cat([rank_weights for _, rank_weights in outputs])
        data.batch["rollout_is_weights"] = weights.to(data.batch["response_mask"].device)
        return reduce_rank_metrics([metrics for metrics, _ in outputs])

    def policy_skeleton(self) -> PolicySkeleton:
        """Return what a rollout worker process builds its weightless policy copy from."""
        return self.group.call_all(self.role, "policy_skeleton")[0]

    def full_state_dict(self) -> dict[str, Any]:
        """Return the gathered policy weights (CPU tensors)."""
        return self.group.call_all(self.role, "full_state_dict")[0]

    def export_hf(self, directory: str | Path) -> Path:
        """Save the gathered policy and tokenizer as a Hugging Face folder (from rank 0)."""
        return self.group.call_all(self.role, "export_hf", str(directory))[0]


class CriticGroup(_RoleOnGroup):
    """The controller's handle on the critic ranks: ``CriticWorker``'s methods over the group."""

    role = "critic"

    def __init__(self, group: WorkerGroup, config: PPOConfig, *, total_steps: int) -> None:
        self.group = group
        self.sp = config.critic.ulysses_sequence_parallel_size  # ranks per sequence
        group.execute_all("build_role", self.role, config, total_steps=total_steps)

    def compute_values(self, data: DataProto) -> DataProto:
        """Return ``values`` (bs, R)."""
        outputs = self.group.call_split(
            self.role, "compute_values", tensors_only(data), sequence_parallel=self.sp
        )
        return gather_batches(*outputs)

    def update_critic(self, data: DataProto) -> dict[str, float]:
        """Update the sharded value model; return metrics reduced over ranks as verl does."""
        outputs, _ = self.group.call_split(
            self.role, "update_critic", tensors_only(data), pad=False, sequence_parallel=self.sp
        )
        return reduce_rank_metrics(outputs)


class RewardModelGroup:
    """The controller's handle on the reward model's ranks: ``RewardModelScorer.score`` over the
    group, verl's ``RewardModelWorker.compute_rm_score`` dispatched as ``DP_COMPUTE_PROTO``.

    The pairs are padded to a multiple of the rank count and cut into equal contiguous shares,
    one per rank (every rank of a sharded classifier runs the same forwards); the scores come
    back in order, the padding dropped. Each rank formats its pairs with the scorer's own
    ``format_text``, so the text is the single-process scorer's.

    A rank's error ends the run, where a local scorer's error only fails the batch's samples
    (``CompositeReward.score_batch``): the other ranks of a sharded forward may still be waiting
    for the failed one in a collective, so the group cannot score again. The call raises it and
    keeps it in :attr:`failure`, which the trainer raises again once the reward manager has
    caught it (``RayPPOTrainer.generate_and_score``).
    """

    role = "reward_model"

    def __init__(self, group: WorkerGroup, config: PPOConfig) -> None:
        self.group = group
        self.failure: BaseException | None = None
        group.execute_all("build_role", self.role, config)

    def score(self, prompts: Sequence[Any], responses: Sequence[str]) -> list[float]:
        """Return one score per (prompt text or chat messages, response) pair, in order."""
        if len(prompts) != len(responses):
            raise ValueError(f"got {len(prompts)} prompts but {len(responses)} responses")
        if not prompts:
            return []
        pairs = list(zip(prompts, responses, strict=True))
        shares, _ = split_rows(pairs, self.group.world_size)
        try:
            per_rank = self.group.call_each(
                self.role, "score", [([p for p, _ in s], [r for _, r in s]) for s in shares]
            )
        except Exception as exc:
            self.failure = exc
            raise
        scores = [score for rank_scores in per_rank for score in rank_scores]
        return scores[: len(pairs)]  # the padding rows come last


def check_sharded(state: dict[str, Any], group: WorkerGroup) -> list[tuple]:
    """Return per-rank arguments for a sharded state; ValueError if it does not fit the group."""
    if state.get("format") != "fsdp2_sharded":
        raise ValueError(
            "this checkpoint was written by the single-process trainer (trainer.controller="
            "local); resume it with trainer.controller=local, or start the Ray run afresh "
            "(trainer.resume_mode=disable)"
        )
    if state["world_size"] != group.world_size:
        raise ValueError(
            f"the checkpoint holds shards of {state['world_size']} ranks but this run has "
            f"{group.world_size}; resume with the trainer.nnodes x trainer.n_gpus_per_node it "
            "was saved with"
        )
    return [(rank_state,) for rank_state in state["ranks"]]
