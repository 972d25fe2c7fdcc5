"""The typed PostTrain Studio configuration: verl's ``ppo_trainer.yaml`` as dataclasses.

Key names, nesting and defaults follow verl so a verl command line or YAML file works unchanged.
Where verl interpolates a value from another key (``critic.ppo_mini_batch_size:
${actor_rollout_ref.actor.ppo_mini_batch_size}``), the field here defaults to ``None`` and
``resolve_config`` fills in the same value; the field's help says so. String fields may still hold
``${dotted.key}`` references, resolved the same way (``trainer.default_local_dir``).
Here is the root, ``PPOConfig``; each section is a module of its own, its rules beside its fields:
``data``, ``actor`` (``actor_rollout_ref``'s model, actor and reference), ``rollout``, ``critic``,
``reward`` (``reward_model``, ``custom_reward_function``, ``reward``, ``reward_manager``),
``algorithm`` and ``trainer`` (with ``ray_init`` and ``ray_kwargs``); ``unsupported`` holds verl's
sections with no engine behind them. Their fields are made by ``engine.config.fields``.

PostTrain extensions to verl's schema: the ``reward`` section, ``algorithm.
allow_single_sample_groups``, ``trainer.device``, ``trainer.controller`` and ``trainer.seed``.
"""

from dataclasses import dataclass, field
from typing import Any

from engine.config.actor import ActorRolloutRefConfig
from engine.config.algorithm import AlgorithmConfig
from engine.config.async_training import AsyncTrainingConfig, RolloutPoolConfig
from engine.config.critic import CriticConfig
from engine.config.data import DataConfig
from engine.config.fields import _Section, _section
from engine.config.reward import CustomRewardFunctionConfig, RewardConfig, RewardManagerConfig
from engine.config.reward_model import RewardModelConfig
from engine.config.trainer import RayInitConfig, RayKwargsConfig, TrainerConfig
from engine.config.unsupported import GlobalProfilerConfig, TransferQueueConfig


@dataclass
class PPOConfig(_Section):
    data: DataConfig = _section(DataConfig, "Training and validation data.")
    actor_rollout_ref: ActorRolloutRefConfig = _section(
        ActorRolloutRefConfig, "Policy, rollout and reference."
    )
    critic: CriticConfig = _section(CriticConfig, "Value model (gae).", bounds_when="critic.enable")
    reward_model: RewardModelConfig = _section(RewardModelConfig, "Model-based reward.")
    custom_reward_function: CustomRewardFunctionConfig = _section(
        CustomRewardFunctionConfig, "User reward function."
    )
    reward: RewardConfig = _section(RewardConfig, "Reward composition (PostTrain).")
    algorithm: AlgorithmConfig = _section(AlgorithmConfig, "Advantage and KL settings.")
    trainer: TrainerConfig = _section(TrainerConfig, "Training loop, logging, checkpoints.")
    ray_init: RayInitConfig = _section(RayInitConfig, "Ray start-up.")
    ray_kwargs: RayKwargsConfig = _section(RayKwargsConfig, "Ray start-up (verl 0.7's place).")
    reward_manager: RewardManagerConfig = _section(RewardManagerConfig, "The reward manager.")
    rollout: RolloutPoolConfig = _section(
        RolloutPoolConfig,
        "The rollout worker of the one-step-off and fully-async trainers (hybrid_engine=False).",
    )
    async_training: AsyncTrainingConfig = _section(
        AsyncTrainingConfig, "verl's fully-async trainer (hybrid_engine=False with these keys)."
    )
    global_profiler: GlobalProfilerConfig = _section(GlobalProfilerConfig, "Profiling.")
    transfer_queue: TransferQueueConfig = _section(TransferQueueConfig, "verl's TransferQueue.")
    extras: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "Keys added with +key=value that PostTrain does not know.",
            "extras": True,
        },
    )
