"""One rank of a worker group: the local workers, sharded with FSDP2, inside a Ray actor.

``ShardedActorRolloutRef`` and ``ShardedCritic`` build the single-process
``ActorRolloutRefWorker`` / ``CriticWorker`` unchanged, then shard their models with FSDP2,
rebuild the optimizers over the sharded parameters and divide the mini-batch sizes by the number
of data-parallel ranks (``ppo_mini_batch_size`` counts prompts over the whole group, as in verl;
``*_micro_batch_size_per_gpu`` stays per rank). Every other call goes to the wrapped worker.

Hybrid engine: rollout and training share the rank. The ``hf`` rollout generates with an
unsharded copy of the policy that is refreshed from the sharded weights (all-gathered parameter
by parameter) before the first generation after an update, and logged as
``timing_s/update_weights``. A copy rather than the sharded module: FSDP2 needs every rank to run
the same number of forward passes, and sampling stops as soon as a rank's own sequences have all
ended. On a GPU the copy leaves the device while the policy trains when
``rollout.free_cache_engine`` is set. The ``vllm`` rollout keeps its own weights: its
``load_weights`` receives the sharded module and gathers it in buckets on every rank.

One rank in full precision without offload has nothing to shard: the policy and reference stay
plain modules and the rollout samples from the policy itself, exactly the single-process
worker's work inside a Ray actor (``fsdp.shards_anything``). Checkpoints keep the same
``fsdp2_sharded`` format either way.

``ShardedRewardModel`` is verl's ``RewardModelWorker``: the single-process
``RewardModelScorer`` (its chat-template formatting and micro-batches unchanged) with the
classifier sharded by FSDP2 over the reward model's pool, each rank scoring its share.

``RankWorker`` is the Ray actor: it joins the process group and hosts the roles colocated on its
rank (actor/rollout/reference and, by default, the critic and the reward model), as verl's fused
worker does.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist

from engine.data import DataProto
from engine.distributed.channel import ChannelServer, reply_for, unpack
from engine.distributed.fsdp import (
    apply_fsdp2,
    check_offload,
    copy_full_weights,
    gather_full_state_dict,
    load_sharded_state_dict,
    move_optimizer_state,
    sharded_state_dict,
    shards_anything,
)
from engine.distributed.process_group import (
    backend_for,
    build_device_mesh,
    free_port,
    init_process_group,
    node_address,
)
from engine.lora import adapter_settings
from engine.roles.actor_rollout_ref import ActorRolloutRefWorker
from engine.roles.critic import CriticWorker
from engine.roles.model_loading import frozen_copy, load_reward_model

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from engine.config import PPOConfig
    from engine.roles.model_loading import PolicySkeleton

ROLLOUT_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class ShardedActorRolloutRef:
    """An ``ActorRolloutRefWorker`` on one rank: FSDP2 policy and reference, unsharded rollout."""

    def __init__(
        self,
        config: PPOConfig,
        *,
        device: torch.device,
        rank: int,
        world_size: int,
        total_steps: int,
        need_ref: bool,
    ) -> None:
        arr = config.actor_rollout_ref
        check_offload(arr.actor.fsdp_config, device.type, "actor_rollout_ref.actor")
        check_offload(arr.ref.fsdp_config, device.type, "actor_rollout_ref.ref")
        self.config = config
        self.device = device
        self.rank = rank
        self.world_size = world_size
        self.sharded = shards_anything(arr.actor.fsdp_config, device.type, world_size)
        self.worker = ActorRolloutRefWorker(
            config,
            device=device,
            total_steps=total_steps,
            need_ref=need_ref,
            rank=rank,
            world_size=world_size,
            shard=self._shard,
        )
        self.offload_optimizer = (
            arr.actor.fsdp_config.optimizer_offload and not arr.actor.fsdp_config.param_offload
        )
        self.weights_version = 0  # bumped by every change of the policy's weights
        self.rollout_version = -1  # the weights_version the rollout copy holds

    def _shard(self, worker: ActorRolloutRefWorker) -> None:
        """Shard the worker's policy and reference with FSDP2 (before its optimizer exists).

        A sharded ``hf`` rollout samples from an unsharded copy (bf16 on a GPU; on a CPU fp32,
        as the actor computes); an unsharded policy samples itself, as in the single-process
        trainer. vLLM holds its own weights and gathers the (possibly sharded) parameters in
        ``load_weights``.
        """
        arr = self.config.actor_rollout_ref
        device = self.device
        if arr.rollout.name == "hf" and self.sharded:
            worker.rollout_model = frozen_copy(worker.model)
            if device.type == "cuda":
                worker.rollout_model.to(dtype=ROLLOUT_DTYPES[arr.rollout.dtype])
        mesh = build_device_mesh(device.type, self.world_size, arr.actor.fsdp_config.fsdp_size)
        if self.sharded:
            apply_fsdp2(
                worker.model, mesh, arr.actor.fsdp_config, device.type, "actor_rollout_ref.actor"
            )
        if worker.ref_model is not None and shards_anything(
            arr.ref.fsdp_config, device.type, self.world_size
        ):
            apply_fsdp2(
                worker.ref_model, mesh, arr.ref.fsdp_config, device.type, "actor_rollout_ref.ref"
            )

    # -- hybrid engine -----------------------------------------------------------------------
    @property
    def rollout_model(self) -> torch.nn.Module | None:
        """Return the unsharded copy the ``hf`` rollout samples from, or None (it samples the
        policy itself, or vLLM holds its own weights)."""
        return self.worker.rollout_model

    def sync_rollout_weights(self) -> float:
        """Load the current policy weights into the rollout copy if stale; return the seconds."""
        start = time.perf_counter()
        rollout_copy = self.rollout_model
        assert rollout_copy is not None, "only a sharded hf rollout samples from a copy"
        rollout_copy.to(self.device)
        if self.rollout_version != self.weights_version:
            copy_full_weights(self.worker.model, rollout_copy, self.device)
            self.rollout_version = self.weights_version
        return time.perf_counter() - start

    def release_rollout(self) -> None:
        """Move the rollout copy off the GPU while the policy trains (free_cache_engine)."""
        free = self.config.actor_rollout_ref.rollout.free_cache_engine
        if self.device.type == "cuda" and free and self.rollout_model is not None:
            self.rollout_model.to("cpu")
            torch.cuda.empty_cache()

    def pad_token_id(self) -> int:
        """Return the id the rollout pads responses with."""
        tokenizer = self.worker.tokenizer
        return int(tokenizer.pad_token_id) if tokenizer.pad_token_id is not None else 0

    def generate_sequences(
        self, prompts: DataProto, *, validate: bool = False, with_ref: bool = False
    ) -> DataProto:
        """Return this rank's rollout, generated with the current policy weights.

        With ``with_ref`` the rollout also carries ``ref_log_prob`` (bs, R), the reference pass
        over the sequences just sampled, and ``timing_s/ref_in_rollout``, its seconds: the
        controller then needs no separate call for it.
        """
        out = self._generate(prompts, validate=validate)
        if with_ref:
            start = time.perf_counter()
            out = out.union(self.compute_ref_log_prob(out))
            out.meta_info["timing_s/ref_in_rollout"] = time.perf_counter() - start
        return out

    def _generate(self, prompts: DataProto, *, validate: bool) -> DataProto:
        if self.rollout_model is None:  # vLLM gathers the shards itself, or nothing is sharded
            return self.worker.generate_sequences(prompts, validate=validate)
        sync_s = self.sync_rollout_weights()
        try:
            out = self.worker.generate_sequences(prompts, validate=validate)
        finally:
            self.release_rollout()
        out.meta_info["timing_s/update_weights"] = sync_s + out.meta_info.get(
            "timing_s/update_weights", 0.0
        )
        return out

    # -- training ----------------------------------------------------------------------------
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """Return ``old_log_probs`` and ``entropys`` (bs, R) for this rank's rows."""
        return self.worker.compute_log_prob(data)

    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """Return ``ref_log_prob`` (bs, R) for this rank's rows."""
        return self.worker.compute_ref_log_prob(data)

    def update_actor(self, data: DataProto) -> dict[str, float]:
        """Update the sharded policy on this rank's rows (gradients averaged over ranks)."""
        optimizer = self.worker.actor.optimizer
        assert optimizer is not None, "the policy's optimizer is built in __init__"
        if self.offload_optimizer:
            move_optimizer_state(optimizer, self.device)
        metrics = self.worker.update_actor(data)
        if self.offload_optimizer:
            move_optimizer_state(optimizer, "cpu")
        self.weights_version += 1
        return metrics

    def update_actor_weighing(self, data: DataProto) -> tuple[dict[str, float], torch.Tensor]:
        """:meth:`update_actor` for an update that weighs its micro-batches from its own pi_old
        (the trainer's ``IS_IN_UPDATE``): also return the IS weights (rows, R) it computed for
        this rank's rows, on the CPU, for the controller's batch."""
        metrics = self.update_actor(data)
        return metrics, data.batch["rollout_is_weights"].cpu()

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Return this rank's shards of weights and optimizer, the schedule and the RNG."""
        actor = self.worker.actor
        state = sharded_state_dict(self.worker.model, actor.optimizer)
        state["lr_scheduler"] = actor.lr_scheduler.state_dict() if actor.lr_scheduler else None
        state["generator"] = self.worker.generator.get_state()
        state["lora"] = adapter_settings(self.worker.model)
        state["rank"], state["world_size"] = self.rank, self.world_size
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` written by the same rank of a same-sized group."""
        load_sharded_state_dict(self.worker.model, self.worker.actor.optimizer, state)
        if state.get("lr_scheduler") and self.worker.actor.lr_scheduler:
            self.worker.actor.lr_scheduler.load_state_dict(state["lr_scheduler"])
        self.worker.generator.set_state(state["generator"])
        self.weights_version += 1

    def policy_skeleton(self) -> PolicySkeleton:
        """Return what a rollout worker process builds its weightless policy copy from."""
        return self.worker.policy_skeleton()

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Return the gathered policy weights on rank 0 (CPU), an empty dict on the others."""
        return gather_full_state_dict(self.worker.model)

    def export_hf(self, directory: str | Path) -> Path | None:
        """Gather the policy and save it from rank 0 as a Hugging Face folder."""
        full = gather_full_state_dict(self.worker.model)
        if self.rank != 0:
            return None
        directory = Path(directory)
        skeleton = self.rollout_model
        if skeleton is None:
            from transformers import AutoModelForCausalLM

            skeleton = AutoModelForCausalLM.from_config(self.worker.model.config)
        cast("PreTrainedModel", skeleton).save_pretrained(directory, state_dict=full)
        self.worker.tokenizer.save_pretrained(directory)
        return directory


class ShardedCritic:
    """A ``CriticWorker`` on one rank with its value model sharded by FSDP2."""

    def __init__(
        self,
        config: PPOConfig,
        *,
        device: torch.device,
        rank: int,
        world_size: int,
        total_steps: int,
    ) -> None:
        critic = config.critic
        fsdp_config = critic.model.fsdp_config
        check_offload(fsdp_config, device.type, "critic.model")
        self.rank, self.world_size = rank, world_size
        self.device = device

        def shard(model: torch.nn.Module) -> None:
            if shards_anything(fsdp_config, device.type, world_size):
                mesh = build_device_mesh(device.type, world_size, fsdp_config.fsdp_size)
                apply_fsdp2(model, mesh, fsdp_config, device.type, "critic.model")

        self.worker = CriticWorker(
            config, device=device, total_steps=total_steps, world_size=world_size, shard=shard
        )
        self.offload_optimizer = fsdp_config.optimizer_offload and not fsdp_config.param_offload

    def compute_values(self, data: DataProto) -> DataProto:
        """Return ``values`` (bs, R) for this rank's rows."""
        return self.worker.compute_values(data)

    def update_critic(self, data: DataProto) -> dict[str, float]:
        """Update the sharded value model on this rank's rows."""
        optimizer = self.worker.critic.optimizer
        if self.offload_optimizer:
            move_optimizer_state(optimizer, self.device)
        metrics = self.worker.update_critic(data)
        if self.offload_optimizer:
            move_optimizer_state(optimizer, "cpu")
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """Return this rank's shards of weights and optimizer, and the schedule."""
        state = sharded_state_dict(self.worker.model, self.worker.critic.optimizer)
        state["lr_scheduler"] = self.worker.critic.lr_scheduler.state_dict()
        state["rank"], state["world_size"] = self.rank, self.world_size
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` written by the same rank of a same-sized group."""
        load_sharded_state_dict(self.worker.model, self.worker.critic.optimizer, state)
        self.worker.critic.lr_scheduler.load_state_dict(state["lr_scheduler"])


class ShardedRewardModel:
    """A ``RewardModelScorer`` on one rank with its classifier sharded by FSDP2 (forward only).

    ``reward_model.model.fsdp_config`` shapes the shards (``fsdp_size``, ``param_offload``,
    ``reshard_after_forward``); compute precision is FSDP's ``auto``, bf16 on a GPU as verl's
    reward model worker, fp32 on a CPU. Every rank of the pool must run the same number of
    forwards (each one all-gathers the layers), so the controller gives every rank an equal
    share (``RewardModelGroup``) and each cuts it into ``micro_batch_size_per_gpu`` batches.
    """

    def __init__(
        self, config: PPOConfig, *, device: torch.device, rank: int, world_size: int
    ) -> None:
        fsdp_config = config.reward_model.model.fsdp_config
        check_offload(fsdp_config, device.type, "reward_model.model")
        self.scorer = load_reward_model(config, device)
        if shards_anything(fsdp_config, device.type, world_size):
            mesh = build_device_mesh(device.type, world_size, fsdp_config.fsdp_size)
            apply_fsdp2(self.scorer.model, mesh, fsdp_config, device.type, "reward_model.model")

    def score(self, prompts: list[Any], responses: list[str]) -> list[float]:
        """Return this rank's scores, one per (prompt, response) pair, in order."""
        return self.scorer.score(prompts, responses)


# The RankWorker methods a packed request may name.
PACKED_METHODS = ("build_role", "call")


def _to(value: Any, device: torch.device | str) -> Any:
    return value.to(device) if isinstance(value, DataProto) else value


class RankWorker:
    """The Ray actor of one rank: joins the process group and hosts the colocated roles."""

    def __init__(self, rank: int, world_size: int, device_type: str) -> None:
        self.rank = rank
        self.world_size = world_size
        if device_type == "cuda":
            # Ray exposes exactly the GPU of this rank's bundle as device 0.
            torch.cuda.set_device(0)
            self.device = torch.device("cuda", 0)
        else:
            from engine.env import apply_cpu_process_env

            apply_cpu_process_env()
            self.device = torch.device("cpu")
        self.roles: dict[str, Any] = {}
        self.channel: ChannelServer | None = None

    def free_address(self) -> tuple[str, int]:
        """Return this node's address and a free port for the group's TCPStore."""
        return node_address(), free_port()

    def init_process_group(self, host: str, port: int) -> int:
        """Join the group's process group; return the process id (for diagnostics)."""
        init_process_group(
            rank=self.rank,
            world_size=self.world_size,
            host=host,
            port=port,
            backend=backend_for(self.device.type),
        )
        return os.getpid()

    def build_role(self, role: str, config: PPOConfig, **kwargs: Any) -> None:
        """Build ``actor_rollout_ref``, ``critic`` or ``reward_model`` on this rank from the
        run's config."""
        from engine.env import seed_everything

        if self.device.type == "cuda":  # the channel's thread starts on the default device
            torch.cuda.set_device(self.device)

        classes = {
            "actor_rollout_ref": ShardedActorRolloutRef,
            "critic": ShardedCritic,
            "reward_model": ShardedRewardModel,
        }
        if role not in classes:
            raise ValueError(f"unknown role {role!r}; valid roles: {', '.join(classes)}")
        seed_everything(config.trainer.seed)  # identical initial weights on every rank
        self.roles[role] = classes[role](
            config, device=self.device, rank=self.rank, world_size=self.world_size, **kwargs
        )

    def call(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``method`` of a hosted role; batches travel to the device and back to the CPU."""
        if role not in self.roles:
            raise RuntimeError(f"role {role!r} is not built on rank {self.rank}")
        args = tuple(_to(a, self.device) for a in args)
        result = getattr(self.roles[role], method)(*args, **kwargs)
        return _to(result, "cpu")

    def call_packed(self, request: bytes | bytearray) -> bytes:
        """Answer a packed ``(method, args, kwargs)`` request for :meth:`build_role` or
        :meth:`call` with a packed reply (``engine.distributed.channel.reply_for``).

        Every such request of a group takes one route, so a rank's roles always run on one
        thread: the direct channel's, or Ray's when the channel is off.
        """

        def run() -> Any:
            name, args, kwargs = unpack(request)
            if name not in PACKED_METHODS:
                raise ValueError(f"{name!r} is not one of {PACKED_METHODS}")
            return getattr(self, name)(*args, **kwargs)

        return reply_for(run)

    def open_channel(self) -> tuple[str, int, bytes]:
        """Start serving the controller's direct connection; return its address and token."""
        self.channel = ChannelServer(self.call_packed, host=node_address())
        return (*self.channel.address, self.channel.token)

    def shutdown(self) -> None:
        """Leave the process group (before the actor is killed)."""
        if self.channel is not None:
            self.channel.close()
        self.roles.clear()
        if dist.is_initialized():
            dist.destroy_process_group()
