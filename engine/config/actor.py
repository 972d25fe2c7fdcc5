"""``actor_rollout_ref``: the policy model and its training (``model``, ``actor`` with ``optim``,
``fsdp_config``, ``checkpoint`` and ``policy_loss``) and the frozen reference (``ref``).

verl's ``HFModelConfig``, ``FSDPActorConfig``, ``FSDPOptimizerConfig`` and ``FSDPEngineConfig``
(``verl/workers/config/``). The rollout's keys are ``engine.config.rollout``. The rules are at the
end: the policy model's folder, the optimiser's betas and warm-up, the dual-clip constant, the
loss against rollout correction, and the batch sizes as verl's FSDP workers check them (the
critic's too).
"""

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.algorithms.names import KL_TYPES, LOSS_AGG_MODES, POLICY_LOSS_MODES
from engine.config.fields import (
    _MULTIMODAL,
    _TIMES_DP_HELP,
    _ULYSSES_ENGINE_COPY,
    MAX_BATCH,
    MAX_STEPS,
    MAX_TOKEN_BUDGET,
    ConfigFieldError,
    Validation,
    _f,
    _global_micro_batch,
    _inert,
    _refused,
    _rollout_n,
    _runtime,
    _Section,
    _section,
    _sequence_parallel,
    _target,
    _ulysses,
)
from engine.config.files import file_problems, model_dir_problems
from engine.config.rollout import RolloutConfig
from engine.config.unsupported import (
    FusedKernelOptions,
    MtpConfig,
    ProfilerConfig,
    RouterReplayConfig,
    TiledMLPConfig,
    WrapPolicyConfig,
)

STRATEGIES = ("fsdp", "fsdp2")
CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")


@dataclass
class ModelConfig(_Section):
    path: str | None = _f(
        None,
        "Hugging Face model folder (or tiny://model, the embedded model).",
        basic=True,
        resource="path",
    )
    tokenizer_path: str | None = _f(
        None, "Tokenizer folder; null: the model path.", resource="path"
    )
    custom_chat_template: str | None = _f(None, "Jinja chat template replacing the tokenizer's.")
    external_lib: str | None = _f(
        None,
        "Python module imported before the policy loads, so a custom model registers.",
        resource="module",
    )
    override_config: dict[str, Any] = _f(
        {},
        "Model config attributes to change before the weights load (attention_dropout, "
        "rope_parameters, ...; a common transformers attribute or a key of the folder's "
        "config.json); never loader arguments, files or code (docs/security.md). A vllm or "
        "sglang rollout builds its model with the same changes (vLLM's hf_overrides).",
    )
    trust_remote_code: bool = _f(False, "Allow custom model code from the model folder.")
    enable_gradient_checkpointing: bool = _f(True, "Recompute activations to save memory.")
    use_remove_padding: bool = _f(
        False,
        "Padding-free forward: each micro-batch's real tokens packed into one row, position ids "
        "restarting per sequence, attention kept inside each sequence (flash-attn varlen on a GPU "
        "when installed); for the policy's log-prob and update passes and the reference. Pays "
        "most with use_dynamic_bsz on responses of varied length. The padded forward runs a "
        "micro-batch in up to four length buckets; on several ranks the ranks agree on one "
        "bucket plan a micro-batch (every FSDP2 forward is a collective, so each rank makes the "
        "same calls).",
    )
    lora_rank: int = _f(0, "LoRA rank; 0 trains all weights.", ge=0)
    lora_alpha: int = _f(16, "LoRA scaling alpha.")
    target_modules: str | list[str] = _f("all-linear", "Modules LoRA adapts.")
    exclude_modules: str | list[str] | None = _f(
        None,
        "Modules LoRA leaves alone: a regex over full module names, or a list of names.",
    )
    lora_adapter_path: str | None = _f(
        None,
        "A saved LoRA adapter folder (adapter_config.json + weights, as PeftModel.save_pretrained "
        "writes) to start from and train on; its rank, alpha and target modules replace lora_rank, "
        "lora_alpha and target_modules. The reference is the base model (the adapter switched off).",
        resource="path",
    )
    _target_: str = _target("verl.workers.config.HFModelConfig")
    hf_config_path: str | None = _refused(
        None,
        "A config.json folder other than the model's.",
        "the model's own config.json is used; change values with model.override_config",
        resource="path",
    )
    use_shm: bool = _inert(False, "Copy the weights through shared memory first.")
    enable_activation_offload: bool = _inert(False, "Offload activations to the CPU.")
    use_liger: bool = _inert(False, "Use Liger kernels.")
    use_fused_kernels: bool = _inert(False, "Use verl's fused log-prob kernels.")
    fused_kernel_options: FusedKernelOptions = _section(FusedKernelOptions, "Fused kernels.")
    tiled_mlp: TiledMLPConfig = _section(TiledMLPConfig, "Tiled MLP.")
    mtp: MtpConfig = _section(MtpConfig, "Multi-token prediction (verl main).")
    hf_model: Any = _runtime("An already loaded model (or PEFT model) to train instead of path.")
    tokenizer: Any = _runtime("An already loaded tokenizer to use instead of tokenizer_path.")


@dataclass
class PolicyLossConfig(_Section):
    loss_mode: str = _f("vanilla", "Policy loss.", choices=POLICY_LOSS_MODES)
    clip_cov_ratio: float = _f(0.0002, "clip_cov: fraction of tokens clipped.")
    clip_cov_lb: float = _f(1.0, "clip_cov: lower covariance bound.")
    clip_cov_ub: float = _f(5.0, "clip_cov: upper covariance bound.")
    geo_mean_global_batch: bool = _f(
        False,
        "The engine's own, for loss_mode=geo_mean: average the sequences' losses over the "
        "mini-batch's sequences that hold a valid token, on every rank, as the other losses "
        "normalise, so the update is the same however the mini-batch is split into micro-batches "
        "and ranks. verl's geo_mean (False) takes each micro-batch's mean over all its rows, "
        "empty ones included, and the micro-batches' shares add up: k micro-batches give k times "
        "the gradient.",
    )
    kl_cov_ratio: float = _f(0.0002, "kl_cov: fraction of tokens given a KL penalty.")
    ppo_kl_coef: float = _f(0.1, "kl_cov: coefficient of that KL penalty.")
    _target_: str = _target("verl.workers.config.PolicyLossConfig")
    rollout_correction: Any = _runtime(
        "algorithm.rollout_correction, which the bypass_mode loss reads; the actor sets it in "
        "bypass mode, as verl's trainer does."
    )


@dataclass
class OptimConfig(_Section):
    lr: float = _f(1e-6, "Learning rate.", basic=True, gt=0)
    lr_warmup_steps: int = _f(-1, "Warm-up steps; -1: use lr_warmup_steps_ratio.", le=MAX_STEPS)
    lr_warmup_steps_ratio: float = _f(0.0, "Warm-up as a fraction of the total steps.", ge=0, le=1)
    min_lr_ratio: float = _f(0.0, "Cosine schedule floor as a fraction of lr.", ge=0, le=1)
    num_cycles: float = _f(0.5, "Cosine schedule cycles.")
    warmup_style: str | None = _f(
        "constant",
        "Schedule after warm-up (verl 0.7: lr_scheduler_type; null: that).",
        choices=("constant", "cosine"),
    )
    weight_decay: float = _f(0.01, "AdamW weight decay.", ge=0)
    betas: list[float] = _f([0.9, 0.999], "AdamW betas.")
    total_training_steps: int = _f(
        -1, "Set by the trainer from the data; -1: not known yet.", le=MAX_STEPS
    )
    _target_: str = _target("verl.workers.config.FSDPOptimizerConfig")
    optimizer: str = _refused(
        "AdamW", "Optimizer class.", "the engine trains with torch.optim.AdamW; keep AdamW"
    )
    optimizer_impl: str = _refused(
        "torch.optim", "Module of the optimizer class.", "the engine uses torch.optim; keep it"
    )
    clip_grad: float = _f(
        1.0, "Gradient norm clip: verl's newer name of the role's grad_clip; set either.", gt=0
    )
    lr_scheduler_type: str = _f(
        "constant",
        "Schedule after warm-up (verl's new name of warmup_style).",
        choices=("constant", "cosine"),
    )
    override_optimizer_config: dict[str, Any] | None = _refused(
        None,
        "Extra optimizer arguments.",
        "optimizer arguments beyond lr, betas and weight_decay are not passed; set those keys",
    )


@dataclass
class FSDPConfig(_Section):
    param_offload: bool = _f(False, "Keep parameters on the CPU between uses.")
    optimizer_offload: bool = _f(False, "Keep optimizer state on the CPU.")
    reshard_after_forward: bool = _f(True, "Free gathered parameters after forward.")
    fsdp_size: int = _f(-1, "Ranks per FSDP shard group; -1: all.")
    mixed_precision: str = _f(
        "auto",
        "Compute precision; auto: bf16 on a GPU, fp32 on a CPU.",
        choices=("auto", "bf16", "fp16", "fp32"),
    )
    _target_: str = _target("verl.workers.config.FSDPEngineConfig")
    wrap_policy: WrapPolicyConfig = _section(WrapPolicyConfig, "Which modules FSDP wraps.")
    offload_policy: bool = _refused(
        False,
        "FSDP2's CPU offload policy.",
        "set fsdp_config.param_offload and optimizer_offload instead",
    )
    forward_prefetch: bool = _inert(False, "Prefetch the next FSDP unit in forward.")
    model_dtype: str = _refused(
        "fp32",
        "dtype of the master weights.",
        "master weights are fp32; choose the compute precision with fsdp_config.mixed_precision",
    )
    use_orig_params: bool = _inert(False, "FSDP1's use_orig_params.")
    seed: int = _refused(
        42, "Seed of the FSDP engine.", "the engine is seeded by trainer.seed; set that"
    )
    full_determinism: bool = _refused(
        False,
        "Deterministic kernels only.",
        "deterministic-only kernels are not switched on; runs are seeded by trainer.seed",
    )
    ulysses_sequence_parallel_size: int = _ulysses(_ULYSSES_ENGINE_COPY)
    entropy_from_logits_with_chunking: bool = _inert(False, "Compute entropy in chunks.")
    use_torch_compile: bool = _inert(True, "torch.compile the entropy computation.")
    entropy_checkpointing: bool = _inert(False, "Recompute entropy in backward.")
    forward_only: bool = _inert(False, "The engine only runs forward (set by verl).")
    strategy: str = _inert("fsdp", "The engine's strategy (set by verl).")
    dtype: str = _refused(
        "bfloat16",
        "Compute dtype of verl's FSDP engine.",
        "choose the compute precision with fsdp_config.mixed_precision (auto: bf16 on a GPU)",
    )


@dataclass
class CheckpointConfig(_Section):
    save_contents: list[str] = _f(
        ["model", "optimizer", "extra"], "What a checkpoint saves.", choices=CHECKPOINT_CONTENTS
    )
    load_contents: list[str] | None = _f(
        None, "What a resume loads; null: save_contents.", choices=CHECKPOINT_CONTENTS
    )
    _target_: str = _target("verl.trainer.config.CheckpointConfig")
    async_save: bool = _inert(False, "Save checkpoints in the background.")


@dataclass
class ActorConfig(_Section):
    strategy: str = _inert(
        "fsdp2",
        "Training backend: verl's fsdp (FSDP1) and fsdp2 both run FSDP2 here.",
        choices=STRATEGIES,
    )
    ppo_mini_batch_size: int = _f(
        256, "Prompts per optimizer step.", basic=True, gt=0, le=MAX_BATCH
    )
    ppo_micro_batch_size_per_gpu: int | None = _f(
        None,
        "Samples per forward pass per GPU; null: the whole per-GPU mini-batch.",
        basic=True,
        gt=0,
        le=MAX_BATCH,
    )
    use_dynamic_bsz: bool = _f(False, "Pack micro-batches by token count.")
    ppo_max_token_len_per_gpu: int = _f(
        16384, "Token budget per micro-batch (use_dynamic_bsz).", gt=0, le=MAX_TOKEN_BUDGET
    )
    grad_clip: float = _f(1.0, "Gradient norm clip.", gt=0)
    clip_ratio: float = _f(0.2, "PPO clip range epsilon.", gt=0)
    clip_ratio_low: float | None = _f(None, "Lower clip range; null: clip_ratio.", gt=0)
    clip_ratio_high: float | None = _f(None, "Upper clip range; null: clip_ratio.", gt=0)
    clip_ratio_c: float = _f(3.0, "Dual-clip constant c (> 1) for negative advantages.")
    tau_pos: float = _f(1.0, "sapo: gate temperature of tokens with A > 0.", gt=0)
    tau_neg: float = _f(1.05, "sapo: gate temperature of tokens with A <= 0.", gt=0)
    loss_agg_mode: str = _f("token-mean", "How token losses are averaged.", choices=LOSS_AGG_MODES)
    seq_mean_token_sum_norm_times_dp: bool = _f(False, _TIMES_DP_HELP)
    entropy_coeff: float = _f(0.0, "Entropy bonus coefficient.", basic=True)
    use_kl_loss: bool = _f(False, "Add a KL-to-reference loss (GRPO).", basic=True)
    kl_loss_coef: float = _f(0.001, "Coefficient of the KL loss.", basic=True, ge=0)
    kl_loss_type: str = _f("low_var_kl", "KL estimator of the loss.", choices=KL_TYPES, basic=True)
    ppo_epochs: int = _f(1, "Passes over each batch.", gt=0)
    use_rollout_log_probs: bool = _f(
        False,
        "pi_old of the update is the rollout's own log-probs, never recomputed (verl's "
        "fully-async trainer).",
    )
    shuffle: bool = _f(False, "Shuffle samples between PPO epochs.")
    policy_loss: PolicyLossConfig = _section(PolicyLossConfig, "Policy loss variant.")
    optim: OptimConfig = _section(OptimConfig, "Actor optimizer.")
    fsdp_config: FSDPConfig = _section(FSDPConfig, "Actor FSDP settings.")
    checkpoint: CheckpointConfig = _section(CheckpointConfig, "Actor checkpoint contents.")
    _target_: str = _target("verl.workers.config.FSDPActorConfig")
    rollout_n: int | None = _rollout_n()
    ppo_micro_batch_size: int | None = _global_micro_batch(
        "forward pass", "ppo_micro_batch_size_per_gpu"
    )
    freeze_vision_tower: bool = _refused(
        False, "Freeze a vision-language model's vision tower.", _MULTIMODAL
    )
    loss_scale_factor: float | None = _refused(
        None,
        "Constant divisor of seq-mean-token-sum-norm losses.",
        "a constant loss scale is not implemented yet; leave it null (the loss is normalised "
        "by the token count)",
    )
    calculate_entropy: bool = _inert(
        False, "Compute entropy without an entropy bonus (the engine always records it)."
    )
    use_torch_compile: bool = _inert(True, "torch.compile the entropy computation.")
    data_loader_seed: int = _f(42, "Seed of the mini-batch shuffle between PPO epochs.")
    use_fused_kernels: bool | None = _inert(
        None,
        "Use verl's fused log-prob kernels; null: model.use_fused_kernels.",
        follows="actor_rollout_ref.model.use_fused_kernels",
    )
    router_replay: RouterReplayConfig = _section(RouterReplayConfig, "MoE router replay.")
    ulysses_sequence_parallel_size: int = _sequence_parallel("actor_rollout_ref.model")
    entropy_from_logits_with_chunking: bool = _inert(False, "Compute entropy in chunks.")
    entropy_checkpointing: bool = _inert(False, "Recompute entropy in backward.")
    use_remove_padding: bool | None = _f(
        None,
        "Padding-free forward; null: model.use_remove_padding (any other value must equal it).",
        follows="actor_rollout_ref.model.use_remove_padding",
    )
    profiler: ProfilerConfig = _section(ProfilerConfig, "Profiling of the actor.")
    use_prefix_grouper: bool = _inert(
        False,
        "verl's PrefixGrouper: a group's shared prompt computed once in the policy's forward. "
        "Always on here where it applies, whatever this says: the padded and the padding-free "
        "(use_remove_padding) forwards run each distinct prompt of a micro-batch once and attend "
        "its responses to the prompt's keys and values (engine.roles.packing). Unlike verl's, it "
        "works with use_remove_padding and use_dynamic_bsz and needs no package; it shares only "
        "inside a micro-batch (verl keeps a group on one rank when balancing), and steps aside "
        "under gradient checkpointing and, padding-free, for models the lean runner does not run.",
    )
    calculate_sum_pi_squared: bool = _inert(
        False,
        "Compute each token's sum of squared probabilities in the old-log-prob pass. Done here "
        "whenever algorithm.adv_estimator reads it (optimal_token_baseline, "
        "tir_optimal_token_baseline), whatever this says; verl needs it set for them.",
    )
    sum_pi_squared_checkpointing: bool = _inert(
        False, "Recompute the sum of squared probabilities in backward to save memory."
    )


@dataclass
class RefConfig(_Section):
    log_prob_micro_batch_size_per_gpu: int | None = _f(
        None,
        "Samples per reference forward per GPU; null: the whole per-GPU batch.",
        gt=0,
        le=MAX_BATCH,
    )
    log_prob_use_dynamic_bsz: bool | None = _f(None, "Null: actor.use_dynamic_bsz.")
    log_prob_max_token_len_per_gpu: int | None = _f(
        None, "Null: actor.ppo_max_token_len_per_gpu.", le=MAX_TOKEN_BUDGET
    )
    fsdp_config: FSDPConfig = _section(
        lambda: FSDPConfig(forward_only=True), "Reference model FSDP settings."
    )
    rollout_n: int | None = _rollout_n()
    strategy: str | None = _refused(
        None,
        "Backend of the reference; null: actor.strategy.",
        "the reference is built like the actor; set actor_rollout_ref.actor.strategy",
        follows="actor_rollout_ref.actor.strategy",
    )
    use_torch_compile: bool = _inert(True, "torch.compile the entropy computation.")
    log_prob_micro_batch_size: int | None = _global_micro_batch(
        "reference forward", "log_prob_micro_batch_size_per_gpu"
    )
    router_replay: RouterReplayConfig = _section(RouterReplayConfig, "MoE router replay.")
    _target_: str = _target("verl.workers.config.FSDPActorConfig")
    ulysses_sequence_parallel_size: int = _sequence_parallel("actor_rollout_ref.model")
    entropy_from_logits_with_chunking: bool = _inert(False, "Compute entropy in chunks.")
    entropy_checkpointing: bool = _inert(False, "Recompute entropy in backward.")
    profiler: ProfilerConfig = _section(ProfilerConfig, "Profiling of the reference.")


@dataclass
class ActorRolloutRefConfig(_Section):
    hybrid_engine: bool = _f(
        True,
        "Actor, rollout and reference share devices and take turns; False: one-step-off "
        "(the next batch generates while this one trains), or fully-async with "
        "async_training.staleness_threshold, trigger_parameter_sync_step or require_batches set.",
    )
    nccl_timeout: int = _inert(600, "Seconds before a stuck NCCL collective fails.")
    model: ModelConfig = _section(ModelConfig, "The policy model.")
    actor: ActorConfig = _section(ActorConfig, "Policy training.")
    ref: RefConfig = _section(RefConfig, "The frozen reference policy.")
    rollout: RolloutConfig = _section(RolloutConfig, "Response generation.")


def actor_problems(v: Validation) -> list[ConfigFieldError]:
    """Return the errors of the policy's keys: its model folder, optimiser, dual-clip constant,
    a loss that only rollout correction may pick, and its batch sizes."""
    arr: ActorRolloutRefConfig = v.cfg.actor_rollout_ref
    actor, model = arr.actor, arr.model
    errors = optim_problems("actor_rollout_ref.actor.optim", actor.optim)
    if actor.clip_ratio_c <= 1:
        errors.append(
            ConfigFieldError(
                "actor_rollout_ref.actor.clip_ratio_c",
                actor.clip_ratio_c,
                "must be > 1 (dual-clip PPO; verl uses 3.0)",
            )
        )
    loss_mode = actor.policy_loss.loss_mode
    if loss_mode == "bypass_mode" and not v.cfg.algorithm.rollout_correction.bypass_mode:
        errors.append(
            ConfigFieldError(
                "actor_rollout_ref.actor.policy_loss.loss_mode",
                loss_mode,
                "bypass_mode is the loss algorithm.rollout_correction.bypass_mode=True trains "
                "with; set that (it picks the loss itself)",
            )
        )
    errors += batch_problems(v, "actor")
    for role in ("actor", "ref"):
        errors += sequence_parallel_problems(v, role)
    has_model = v.given.actor_rollout_ref.model.hf_model is not None
    if model.path is None and not has_model:
        errors.append(
            ConfigFieldError(
                "actor_rollout_ref.model.path",
                model.path,
                "point actor_rollout_ref.model.path at a local Hugging Face folder, or use "
                "tiny://model",
            )
        )
    if not v.check_files:
        return errors
    if model.path and not has_model:
        errors += model_dir_problems(v, "actor_rollout_ref.model.path", model.path)
    given = v.given.actor_rollout_ref.model
    if given.tokenizer_path and given.tokenizer_path != model.path and given.tokenizer is None:
        errors += file_problems(
            v,
            "actor_rollout_ref.model.tokenizer_path",
            given.tokenizer_path,
            "point it at a tokenizer folder",
        )
    adapter = given.lora_adapter_path
    if adapter:
        key = "actor_rollout_ref.model.lora_adapter_path"
        found = file_problems(v, key, adapter, "point it at a saved LoRA adapter folder")
        folder = Path(adapter).expanduser()
        if not found and folder.is_dir() and not (folder / "adapter_config.json").is_file():
            found = [
                ConfigFieldError(
                    key,
                    adapter,
                    f"{folder} holds no adapter_config.json; point it at a folder saved by "
                    "PeftModel.save_pretrained (or python -m engine.model_merger "
                    "--save-lora-adapter)",
                )
            ]
        errors += found
    return errors


def optim_problems(prefix: str, optim: OptimConfig) -> list[ConfigFieldError]:
    """Return the errors of an optimiser's keys that a bound cannot say (the actor's, the
    critic's): -1 for the warm-up ratio, a pair of betas."""
    errors = []
    if optim.lr_warmup_steps < -1:
        errors.append(
            ConfigFieldError(
                f"{prefix}.lr_warmup_steps",
                optim.lr_warmup_steps,
                "must be >= -1 (-1: use lr_warmup_steps_ratio)",
            )
        )
    if len(optim.betas) != 2 or not all(0 <= b < 1 for b in optim.betas):
        errors.append(
            ConfigFieldError(
                f"{prefix}.betas", optim.betas, "must be two numbers in [0, 1), e.g. [0.9, 0.999]"
            )
        )
    return errors


def sequence_parallel_problems(v: Validation, role: str) -> list[ConfigFieldError]:
    """Return the errors of a role's ``ulysses_sequence_parallel_size`` (actor, ref or critic):
    it divides the ranks, and the role's forward runs packed rows (use_remove_padding), the
    only ones it splits. Whether the model's heads split is checked when it is loaded."""
    cfg = v.cfg
    if role == "critic":
        size, prefix, model_key = (
            cfg.critic.ulysses_sequence_parallel_size,
            "critic",
            "critic.model",
        )
        packed = cfg.critic.model.use_remove_padding
    else:
        section = getattr(cfg.actor_rollout_ref, role)
        size, prefix = section.ulysses_sequence_parallel_size, f"actor_rollout_ref.{role}"
        model_key, packed = (
            "actor_rollout_ref.model",
            cfg.actor_rollout_ref.model.use_remove_padding,
        )
    workers = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    if size <= 1 or workers <= 0:
        return []
    key = f"{prefix}.ulysses_sequence_parallel_size"
    errors = []
    if workers % size:
        divisors = [d for d in range(1, workers + 1) if workers % d == 0]
        errors.append(
            ConfigFieldError(
                key,
                size,
                f"must divide the {workers} ranks (trainer.nnodes x trainer.n_gpus_per_node), "
                f"whose data-parallel size is ranks / it; use one of {divisors} (1: off) or more ranks",
            )
        )
    if not packed:
        errors.append(
            ConfigFieldError(
                key,
                size,
                f"splits packed rows only: set {model_key}.use_remove_padding=True (verl asks the "
                "same), or keep 1",
            )
        )
    return errors


def batch_problems(v: Validation, role: str) -> list[ConfigFieldError]:
    """Return the errors of one trainable role's batch sizes (actor or critic), checked as verl's
    FSDP workers check them: a mini-batch times rollout.n splits evenly over the data-parallel
    ranks (the workers / ulysses_sequence_parallel_size), and each one's share is a multiple of
    its micro-batch. The actor's also checks that the whole batch splits evenly over the workers
    (the rollout runs on every one)."""
    cfg = v.cfg
    section: Any = cfg.critic if role == "critic" else cfg.actor_rollout_ref.actor
    prefix = "critic" if role == "critic" else "actor_rollout_ref.actor"
    n, batch, mini = (
        cfg.actor_rollout_ref.rollout.n,
        cfg.data.train_batch_size,
        section.ppo_mini_batch_size,
    )
    workers = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    if min(n, batch, mini, workers) <= 0 or max(n, batch, mini) > MAX_BATCH:
        return []  # reported by the bounds
    errors = []
    if role == "actor" and batch * n % workers:
        errors.append(
            ConfigFieldError(
                "data.train_batch_size",
                batch,
                f"train_batch_size * rollout.n = {batch * n} samples cannot be split evenly over "
                f"{workers} workers (trainer.nnodes * trainer.n_gpus_per_node); make it a multiple",
            )
        )
    if batch % mini:
        # The largest divisor of batch up to mini, from the pairs (d, batch // d) with d <= sqrt.
        pairs = (
            p for d in range(1, math.isqrt(batch) + 1) if batch % d == 0 for p in (d, batch // d)
        )
        divisor = max(d for d in pairs if d <= mini)
        errors.append(
            ConfigFieldError(
                f"{prefix}.ppo_mini_batch_size",
                mini,
                f"data.train_batch_size={batch} is not a multiple of it; use a divisor such as "
                f"{divisor}",
            )
        )
    sp = section.ulysses_sequence_parallel_size
    if sp > 1 and workers % sp == 0:  # sp groups hold the same rows (else refused on its own)
        dp, ranks = workers // sp, f"{workers // sp} data-parallel ranks ({workers} workers / "
        ranks += f"{prefix}.ulysses_sequence_parallel_size={sp})"
    else:
        dp, ranks = workers, f"{workers} workers"
    if mini * n % dp:
        errors.append(
            ConfigFieldError(
                f"{prefix}.ppo_mini_batch_size",
                mini,
                f"a mini-batch of {mini * n} samples (ppo_mini_batch_size * rollout.n) cannot be "
                f"split evenly over {ranks}; make it a multiple of {dp}",
            )
        )
        return errors
    per_worker, micro = mini * n // dp, section.ppo_micro_batch_size_per_gpu
    if micro and not section.use_dynamic_bsz and per_worker % micro:
        errors.append(
            ConfigFieldError(
                f"{prefix}.ppo_micro_batch_size_per_gpu",
                micro,
                f"each worker's mini-batch has {per_worker} samples, not a multiple of {micro}; "
                f"use a divisor of {per_worker}",
            )
        )
    longest = cfg.data.max_prompt_length + cfg.data.max_response_length
    if section.use_dynamic_bsz and section.ppo_max_token_len_per_gpu < longest:
        errors.append(
            ConfigFieldError(
                f"{prefix}.ppo_max_token_len_per_gpu",
                section.ppo_max_token_len_per_gpu,
                "must hold one full sequence: at least max_prompt_length + max_response_length = "
                f"{longest}",
            )
        )
    return errors
