"""``RayPPOTrainer``: the single-controller loop of ``PPOTrainer`` driving Ray worker groups.

Only the construction differs: the data, reward managers and KL controller are built as in the
single-process trainer, and the actor/rollout/reference, the critic and the reward model become
proxies over Ray worker groups of FSDP2-sharded ranks with the same method names (the reward
manager gets the reward model's proxy in place of a scorer; no reward model is loaded in the
driver). A generative judge (``reward_model.judge``) is the exception: it generates in the
driver, as verl's reward loop serves its judge beside the trainer, and no role starts for it. Resource pools follow verl's ``ResourcePoolManager``: ``resource_pool_spec`` maps a pool
name to ranks per node and ``mapping`` maps each role to a pool. By default there is one pool,
``global_pool``, of ``trainer.nnodes`` x ``trainer.n_gpus_per_node`` ranks hosting every role (the
hybrid engine); ``{"critic": "critic_pool"}`` with a second pool in the spec puts the critic on its
own ranks. ``reward_model.enable_resource_pool=True`` adds verl's ``reward_pool`` of
``reward_model.nnodes`` x ``reward_model.n_gpus_per_node`` ranks and maps the reward model to it.
"""

from __future__ import annotations

from typing import Any

from engine.config import ConfigValidationError, PPOConfig
from engine.config.fields import resolved
from engine.config.reward_model import own_reward_pool, reward_pool_problems, uses_judge
from engine.data import DataProto
from engine.distributed.fsdp import check_offload
from engine.distributed.worker_group import (
    ActorRolloutRefGroup,
    CriticGroup,
    RayWorkerGroup,
    ResourcePool,
    RewardModelGroup,
    init_ray,
    resolve_worker_device,
)
from engine.roles.batch_sizes import per_rank_size
from engine.trainer.ppo_trainer import PPOTrainer
from engine.trainer.reporting import Recorder

GLOBAL_POOL = "global_pool"
REWARD_POOL = "reward_pool"
ROLES = ("actor_rollout_ref", "critic", "reward_model")


def reward_model_role(config: PPOConfig) -> bool:
    """Return True when the reward model is a role on the ranks: a sequence classifier. A
    generative judge (``reward_model.judge``) generates in the driver's process instead."""
    return bool(config.reward_model.enable) and not uses_judge(config)


def default_resource_pool_spec(config: PPOConfig) -> dict[str, list[int]]:
    """Return ``{"global_pool": [n_gpus_per_node] * nnodes}``, and verl's ``reward_pool`` of
    ``[reward_model.n_gpus_per_node] * reward_model.nnodes`` with ``enable_resource_pool``."""
    trainer = config.trainer
    if trainer.nnodes < 1 or trainer.n_gpus_per_node < 1:
        raise ValueError(
            f"trainer.nnodes={trainer.nnodes} and trainer.n_gpus_per_node="
            f"{trainer.n_gpus_per_node} must both be at least 1"
        )
    problems = reward_pool_problems(config)
    if problems:
        raise ConfigValidationError(problems)
    spec = {GLOBAL_POOL: [trainer.n_gpus_per_node] * trainer.nnodes}
    if own_reward_pool(config):
        spec[REWARD_POOL] = [config.reward_model.n_gpus_per_node] * config.reward_model.nnodes
    return spec


def default_mapping(config: PPOConfig) -> dict[str, str]:
    """Return each role's pool: the global pool, or ``reward_pool`` for an own reward pool."""
    mapping = dict.fromkeys(ROLES, GLOBAL_POOL)
    if own_reward_pool(config):
        mapping["reward_model"] = REWARD_POOL
    return mapping


def check_batch_split(config: PPOConfig, world_size: int, *, use_critic: bool) -> None:
    """Raise ValueError unless every update batch splits evenly over ``world_size`` ranks: the
    whole batch over all of them, a mini-batch over the role's data-parallel ranks (the ranks /
    its ``ulysses_sequence_parallel_size``)."""
    n = config.actor_rollout_ref.rollout.n
    actor = config.actor_rollout_ref.actor
    sizes = {  # key: (size, data-parallel ranks)
        "data.train_batch_size": (config.data.train_batch_size, world_size),
        "actor_rollout_ref.actor.ppo_mini_batch_size": (
            actor.ppo_mini_batch_size,
            world_size // actor.ulysses_sequence_parallel_size,
        ),
    }
    if use_critic:
        key = "critic.ppo_mini_batch_size"
        sizes[key] = (
            resolved(config.critic.ppo_mini_batch_size, key),
            world_size // config.critic.ulysses_sequence_parallel_size,
        )
    for key, (size, ranks) in sizes.items():
        per_rank_size(size * n, ranks, key)


class RayPPOTrainer(PPOTrainer):
    """``PPOTrainer`` whose workers are Ray worker groups of FSDP2 ranks."""

    def __init__(
        self,
        config: PPOConfig,
        recorder: Recorder | None = None,
        *,
        resource_pool_spec: dict[str, list[int]] | None = None,
        mapping: dict[str, str] | None = None,
        cpus_per_rank: float = 1.0,
    ) -> None:
        self.resource_pool_spec = resource_pool_spec or default_resource_pool_spec(config)
        self.mapping = default_mapping(config) | dict(mapping or {})
        self.cpus_per_rank = cpus_per_rank
        self.worker_groups: dict[str, RayWorkerGroup] = {}
        self.reward_model: RewardModelGroup | None = None
        super().__init__(config, recorder)

    @property
    def n_devices(self) -> int:
        """Return the ranks of every pool: ``perf/throughput`` is per rank, as in verl."""
        return sum(group.world_size for group in self.worker_groups.values()) or 1

    # -- construction: everything as PPOTrainer._build, but the workers ----------------------
    def _build_reward(self, scorer: Any = None) -> None:
        """Build the reward managers; with a reward model, once its role's proxy exists."""
        if reward_model_role(self.config) and scorer is None:
            return  # _build_workers builds them around the reward model's RewardModelGroup
        super()._build_reward(scorer)  # a generative judge generates in this process

    def _build_workers(self) -> None:
        """Start the resource pools' worker groups and the role proxies on them."""
        config = self.config
        roles = [
            "actor_rollout_ref",
            *(["critic"] if self.use_critic else []),
            *(["reward_model"] if reward_model_role(config) else []),
        ]
        unknown = [r for r in self.mapping if r not in ROLES]
        missing = {self.mapping[r] for r in roles} - set(self.resource_pool_spec)
        if unknown or missing:
            raise ValueError(
                f"resource pool mapping: unknown roles {unknown} or pools {sorted(missing)} not "
                f"in resource_pool_spec {sorted(self.resource_pool_spec)}; roles are {ROLES}"
            )
        init_ray(config.ray_init)
        device_type = resolve_worker_device(config.trainer.device)
        arr = config.actor_rollout_ref
        check_offload(arr.actor.fsdp_config, device_type, "actor_rollout_ref.actor")
        check_offload(arr.ref.fsdp_config, device_type, "actor_rollout_ref.ref")
        if self.use_critic:
            check_offload(config.critic.model.fsdp_config, device_type, "critic.model")
        if reward_model_role(config):
            check_offload(config.reward_model.model.fsdp_config, device_type, "reward_model.model")
        for role in roles:
            if role == "reward_model":  # scoring pads its batch; it has no update to split
                continue
            pool_name = self.mapping[role]
            world_size = sum(self.resource_pool_spec[pool_name])
            check_batch_split(config, world_size, use_critic=role == "critic")
        try:
            for pool_name in dict.fromkeys(self.mapping[r] for r in roles):
                pool = ResourcePool(
                    pool_name,
                    tuple(self.resource_pool_spec[pool_name]),
                    device_type=device_type,
                    cpus_per_rank=self.cpus_per_rank,
                )
                self.worker_groups[pool_name] = RayWorkerGroup(pool)
            # Proxies with the local workers' method names stand in for the local workers.
            self.arr = ActorRolloutRefGroup(
                self.worker_groups[self.mapping["actor_rollout_ref"]],
                config,
                total_steps=self.total_steps,
                need_ref=self.need_ref,
            )
            if self.use_critic:
                self.critic = CriticGroup(
                    self.worker_groups[self.mapping["critic"]], config, total_steps=self.total_steps
                )
            else:
                self.critic = None
            if reward_model_role(config):
                self.reward_model = RewardModelGroup(
                    self.worker_groups[self.mapping["reward_model"]], config
                )
                self._build_reward(self.reward_model)
        except BaseException:
            self.shutdown()
            raise

    def score_joined(
        self, prompts: DataProto, batch: DataProto, *, timing: dict[str, float]
    ) -> tuple[DataProto, dict]:
        """Score a joined rollout as ``PPOTrainer.score_joined``; raise the reward model's rank
        error, which the reward manager turned into failed samples."""
        scored = super().score_joined(prompts, batch, timing=timing)
        if self.reward_model is not None and self.reward_model.failure is not None:
            raise self.reward_model.failure
        return scored

    def close(self) -> None:
        """Close the reward managers as ``PPOTrainer.close`` does, then release the Ray actors."""
        try:
            super().close()
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        """Kill the worker groups' actors and free their resources."""
        for group in self.worker_groups.values():
            group.shutdown()
        self.worker_groups = {}
