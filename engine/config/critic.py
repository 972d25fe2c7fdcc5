"""``critic``: the value model of GAE, its optimiser and batch sizes.

verl's ``FSDPCriticConfig`` (``verl/workers/config/critic.py``); its optimiser, FSDP and
checkpoint sections are the actor's classes, and its batch sizes are checked as the actor's. The
rules are at the end: a critic for gae, its optimiser, batches and model folder.
"""

from dataclasses import dataclass
from typing import Any

from engine.algorithms.names import LOSS_AGG_MODES
from engine.config.actor import (
    STRATEGIES,
    CheckpointConfig,
    FSDPConfig,
    OptimConfig,
    batch_problems,
    optim_problems,
    sequence_parallel_problems,
)
from engine.config.fields import (
    _TIMES_DP_HELP,
    MAX_BATCH,
    MAX_TOKEN_BUDGET,
    ConfigFieldError,
    Validation,
    _f,
    _global_micro_batch,
    _inert,
    _refused,
    _rollout_n,
    _Section,
    _section,
    _sequence_parallel,
    _target,
)
from engine.config.files import model_dir_problems
from engine.config.unsupported import ProfilerConfig, TiledMLPConfig


@dataclass
class CriticModelConfig(_Section):
    path: str | None = _f(
        None, "Critic model folder; null: the actor's model path.", resource="path"
    )
    tokenizer_path: str | None = _f(None, "Null: the actor's tokenizer.", resource="path")
    override_config: dict[str, Any] = _f(
        {},
        "Critic model config attributes to change before the weights load, as "
        "actor_rollout_ref.model.override_config.",
    )
    external_lib: str | None = _f(
        None,
        "Python module imported before the critic loads, so a custom model registers.",
        resource="module",
    )
    trust_remote_code: bool = _f(False, "Allow custom model code from the model folder.")
    enable_gradient_checkpointing: bool = _f(True, "Recompute activations to save memory.")
    use_remove_padding: bool = _f(
        False,
        "Padding-free forward of the value model: each micro-batch's real tokens packed into "
        "one row, attention kept inside each sequence (transformers' packed sequences).",
    )
    fsdp_config: FSDPConfig = _section(FSDPConfig, "Critic FSDP settings.")
    _target_: str = _target("verl.workers.config.FSDPCriticModelCfg")
    use_shm: bool = _inert(False, "Copy the weights through shared memory first.")
    enable_activation_offload: bool = _inert(False, "Offload activations to the CPU.")
    lora_rank: int = _refused(0, "LoRA rank of the critic.", "a LoRA critic is not implemented")
    lora_alpha: int = _refused(16, "LoRA alpha of the critic.", "a LoRA critic is not implemented")
    target_modules: str | list[str] = _refused(
        "all-linear", "Modules a LoRA critic adapts.", "a LoRA critic is not implemented"
    )
    tiled_mlp: TiledMLPConfig = _section(TiledMLPConfig, "Tiled MLP.")


@dataclass
class CriticConfig(_Section):
    enable: bool | None = _f(None, "Train a value model; null: on for gae, off otherwise.")
    strategy: str | None = _inert(
        None,
        "Null: actor.strategy (fsdp and fsdp2 both run FSDP2 here).",
        choices=STRATEGIES,
        follows="actor_rollout_ref.actor.strategy",
    )
    optim: OptimConfig = _section(lambda: OptimConfig(lr=1e-5), "Critic optimizer.")
    model: CriticModelConfig = _section(CriticModelConfig, "The value model.")
    ppo_mini_batch_size: int | None = _f(
        None, "Prompts per critic step; null: actor's.", gt=0, le=MAX_BATCH
    )
    ppo_micro_batch_size_per_gpu: int | None = _f(
        None, "Null: the whole per-GPU mini-batch.", gt=0, le=MAX_BATCH
    )
    use_dynamic_bsz: bool | None = _f(None, "Null: actor.use_dynamic_bsz.")
    ppo_max_token_len_per_gpu: int = _f(
        32768, "Token budget per micro-batch (use_dynamic_bsz).", gt=0, le=MAX_TOKEN_BUDGET
    )
    ppo_epochs: int | None = _f(None, "Passes over each batch; null: actor's.", gt=0)
    shuffle: bool | None = _f(None, "Null: actor.shuffle.")
    grad_clip: float = _f(1.0, "Gradient norm clip.", gt=0)
    cliprange_value: float = _f(0.5, "Value clip range.", gt=0)
    loss_agg_mode: str = _f("token-mean", "How token losses are averaged.", choices=LOSS_AGG_MODES)
    seq_mean_token_sum_norm_times_dp: bool = _f(False, _TIMES_DP_HELP)
    checkpoint: CheckpointConfig = _section(CheckpointConfig, "Critic checkpoint contents.")
    _target_: str = _target("verl.workers.config.FSDPCriticConfig")
    rollout_n: int | None = _rollout_n()
    ppo_micro_batch_size: int | None = _global_micro_batch(
        "forward", "ppo_micro_batch_size_per_gpu"
    )
    forward_max_token_len_per_gpu: int | None = _f(
        None,
        "Token budget per values micro-batch (use_dynamic_bsz); null: ppo_max_token_len_per_gpu.",
        gt=0,
        le=MAX_TOKEN_BUDGET,
    )
    data_loader_seed: int = _f(42, "Seed of the mini-batch shuffle between PPO epochs.")
    forward_micro_batch_size: int | None = _global_micro_batch(
        "values forward", "forward_micro_batch_size_per_gpu"
    )
    forward_micro_batch_size_per_gpu: int | None = _f(
        None,
        "Samples per values forward per GPU; null: ppo_micro_batch_size_per_gpu.",
        gt=0,
        le=MAX_BATCH,
    )
    ulysses_sequence_parallel_size: int = _sequence_parallel("critic.model")
    profiler: ProfilerConfig = _section(ProfilerConfig, "Profiling of the critic.")


def critic_problems(v: Validation) -> list[ConfigFieldError]:
    """Return the errors of the critic's keys: a value model for gae, its optimiser, and, when it
    is trained, its batch sizes and model folder; warn when it is trained but not used."""
    critic: CriticConfig = v.cfg.critic
    estimator = v.cfg.algorithm.adv_estimator
    enable = v.given.critic.enable  # null: on for gae (resolve_config), so only False is asked
    errors = optim_problems("critic.optim", critic.optim)
    if estimator == "gae" and enable is False:
        errors.append(
            ConfigFieldError(
                "critic.enable",
                False,
                "gae needs a value model; set critic.enable=True (or null), or choose a "
                "critic-free estimator such as algorithm.adv_estimator=grpo",
            )
        )
    if estimator != "gae" and enable:
        v.warnings.append(
            f"critic.enable=True with algorithm.adv_estimator={estimator}: the critic is trained "
            "but its values are not used"
        )
    if not critic.enable:
        return errors
    errors += batch_problems(v, "critic")
    errors += sequence_parallel_problems(v, "critic")
    model_path = v.cfg.actor_rollout_ref.model.path
    if v.check_files and critic.model.path and critic.model.path != model_path:
        errors += model_dir_problems(v, "critic.model.path", critic.model.path)
    return errors
