"""The typed PostTrain Studio configuration: verl's ``ppo_trainer.yaml`` as dataclasses.

Key names, nesting and defaults follow verl so a verl command line or YAML file works unchanged.
Where verl interpolates a value from another key (``critic.ppo_mini_batch_size:
${actor_rollout_ref.actor.ppo_mini_batch_size}``), the field here defaults to ``None`` and
``resolve_config`` fills in the same value; the field's help says so. String fields may still hold
``${dotted.key}`` references, resolved the same way (``trainer.default_local_dir``).

Field metadata carries everything the CLI, the validator and the web form need:
``help`` (every field), ``choices`` (valid string values), ``gt``/``ge``/``lt``/``le`` (bounds of
a number; a count's maximum is a ``Limit`` that says why: what the database or the engine holds),
``resource`` (what a string names: a path, code, a module or a server setting), ``basic`` (shown
outside the form's advanced section) and ``runtime`` (Python-only objects, never serialised or
shown in the form).
PostTrain extensions to verl's schema: the ``reward`` section, ``algorithm.
allow_single_sample_groups``, ``trainer.device``, ``trainer.controller`` and ``trainer.seed``.
"""

import copy
import difflib
from dataclasses import dataclass, field
from typing import Any

# The choices of the algorithm and reward keys are the registries' own lists (torch-free);
# GROUP_ESTIMATORS, KL_ESTIMATORS and REWARD_FN_NAMES are re-exported for the validator and tests.
from engine.algorithms.names import (
    ADV_ESTIMATORS,
    GROUP_ESTIMATORS,  # noqa: F401
    KL_CONTROLLER_TYPES,
    KL_ESTIMATORS,  # noqa: F401
    KL_TYPES,
    LOSS_AGG_MODES,
    PF_PPO_REWEIGHT_METHODS,
    POLICY_LOSS_MODES,
)
from engine.rewards.names import REWARD_COMPONENTS, REWARD_FN_NAMES  # noqa: F401
from engine.rollout import ROLLOUT_NAMES

STRATEGIES = ("fsdp", "fsdp2")


class Limit(int):
    """An upper bound of a count that carries why it exists, for the validator's message."""

    why: str

    def __new__(cls, value: int, why: str) -> "Limit":
        limit = super().__new__(cls, value)
        limit.why = why
        return limit


# The largest counts a config may ask for, so that a run never fails at its start (or hours in)
# on a number the database or the engine cannot hold: steps, indices and lengths are PostgreSQL
# ``integer`` columns (a run's total and latest step, each sample's step, index and length).
MAX_STEPS = Limit(2**31 - 1, "step numbers are stored as 32-bit integers")
MAX_EPOCHS = Limit(1_000_000, "epochs times batches per epoch is the step count, a 32-bit integer")
MAX_TOKENS = Limit(2**20, "the longest prompt or response the engine allocates for")
MAX_TOKEN_BUDGET = Limit(2**24, "the most tokens one micro-batch or sequence holds")
MAX_BATCH = Limit(2**20, "the most prompts or samples one batch holds")
MAX_WORKERS = Limit(1024, "the most processes of one kind a run starts")
# What a string field names, for the studio's rules on a shared server (webapp.experiments.configs):
#   path    a file or folder the run reads (data, model, tokenizer, checkpoint to resume from)
#   code    a Python file whose code the run executes
#   module  a Python module the run imports by name
#   server  a setting of the machine the run uses (a folder it writes, a cluster address)
RESOURCES = ("path", "code", "module", "server")
CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")
DATA_KEY_MAP_TARGETS = ("prompt", "ground_truth", "data_source", "ability")


class ConfigError(ValueError):
    """A configuration could not be loaded or is invalid."""


class ConfigFieldError(ConfigError):
    """One problem with one key: what is wrong and how to fix it."""

    def __init__(self, key: str, value: Any, message: str) -> None:
        self.key, self.value, self.message = key, value, message
        super().__init__(f"{key}={value!r}: {message}" if key else message)


class ConfigValidationError(ConfigError):
    """Every problem ``validate_config`` found, each a ``ConfigFieldError``."""

    def __init__(self, errors: list[ConfigFieldError], warnings: list[str] | None = None) -> None:
        self.errors, self.warnings = list(errors), list(warnings or [])
        lines = "\n".join(f"  {error}" for error in self.errors)
        super().__init__(f"{len(self.errors)} configuration error(s):\n{lines}")


# Hints for attributes a section does not have, by (section class, name): the tutorial spellings
# that engine.config.aliases could not turn into a property of that section.
ATTRIBUTE_HINTS: dict[tuple[type, str], str] = {}


class _Section:
    """A config section: setting an attribute that is not one of its keys is an error.

    A dataclass would keep ``config.trainer.total_step = 5`` as a new attribute that nothing
    reads; a run would then ignore it without a word.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        cls = type(self)
        if name not in cls.__dataclass_fields__ and not isinstance(  # type: ignore[attr-defined]
            getattr(cls, name, None), property
        ):
            hint = ATTRIBUTE_HINTS.get((cls, name))
            if hint is None:
                keys = list(cls.__dataclass_fields__)  # type: ignore[attr-defined]
                close = difflib.get_close_matches(name, keys, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                hint += f"its keys: {', '.join(keys)}"
            raise AttributeError(f"{cls.__name__} has no key {name!r}; {hint}")
        object.__setattr__(self, name, value)


def _f(
    default: Any,
    help: str,
    *,
    choices: tuple[str, ...] | None = None,
    basic: bool = False,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    resource: str | None = None,
) -> Any:
    """Return a field with help text; mutable defaults are copied per instance.

    ``gt``, ``ge``, ``lt`` and ``le`` bound a number (``> gt``, ``>= ge``, ...; None passes):
    the validator checks them and the form gives its input ``min`` and ``max``. ``resource``
    says what a string names (one of ``RESOURCES``: path, code, module, server).
    """
    if resource is not None and resource not in RESOURCES:
        raise ValueError(f"resource={resource!r}: must be one of {', '.join(RESOURCES)}")
    metadata = {
        "help": help,
        "choices": choices,
        "basic": basic,
        "gt": gt,
        "ge": ge,
        "lt": lt,
        "le": le,
        "resource": resource,
    }
    if isinstance(default, list | dict):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def _section(factory: Any, help: str, *, bounds_when: str | None = None) -> Any:
    """Return a field holding a nested section.

    ``bounds_when`` names a key (``critic.enable``): the section's ``gt``/``ge``/``lt``/``le``
    bounds are checked only when its resolved value is true.
    """
    metadata = {"help": help, "bounds_when": bounds_when} if bounds_when else {"help": help}
    return field(default_factory=factory, metadata=metadata)


def _runtime(help: str) -> Any:
    """Return a Python-only field: not compared, not serialised, not in the form."""
    return field(default=None, compare=False, repr=False, metadata={"help": help, "runtime": True})


@dataclass
class DataConfig(_Section):
    tokenizer: str | None = _f(
        None, "Tokenizer folder for the data; null uses the actor's.", resource="path"
    )
    train_files: str | list[str] | None = _f(
        None,
        "Training data: a parquet/JSONL/CSV file or a list of them.",
        basic=True,
        resource="path",
    )
    val_files: str | list[str] | None = _f(
        None,
        "Validation data (needed when trainer.test_freq > 0 or val_before_train).",
        basic=True,
        resource="path",
    )
    prompt_key: str = _f("prompt", "Column holding the prompt (chat messages or text).")
    reward_fn_key: str = _f("data_source", "Column that selects the reward function.")
    max_prompt_length: int = _f(512, "Longest prompt in tokens.", basic=True, gt=0, le=MAX_TOKENS)
    max_response_length: int = _f(
        512, "Most tokens generated per response.", basic=True, gt=0, le=MAX_TOKENS
    )
    train_batch_size: int = _f(1024, "Prompts per training step.", basic=True, gt=0, le=MAX_BATCH)
    val_batch_size: int | None = _f(
        None, "Prompts per validation batch; null: whole set.", gt=0, le=MAX_BATCH
    )
    return_raw_input_ids: bool = _f(False, "Also return unpadded prompt ids.")
    return_raw_chat: bool = _f(False, "Also return the prompt as chat messages.")
    return_full_prompt: bool = _f(False, "Also return the prompt with the chat template applied.")
    shuffle: bool = _f(True, "Shuffle the training data each epoch.")
    validation_shuffle: bool = _f(False, "Shuffle the validation data.")
    seed: int = _f(1, "Seed of the training data shuffle.")
    dataloader_num_workers: int = _f(
        8, "Data loader worker processes (0: load in the driver).", ge=0, le=MAX_WORKERS
    )
    truncation: str = _f(
        "error",
        "What to do with a prompt over max_prompt_length.",
        choices=("error", "left", "right", "middle"),
    )
    filter_overlong_prompts: bool = _f(False, "Drop prompts longer than max_prompt_length.")
    trust_remote_code: bool = _f(False, "Allow custom tokenizer code from the model folder.")
    data_key_map: dict[str, str] = _f(
        {}, "Column mapping target->source, e.g. {prompt: question, ground_truth: answer}."
    )


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
        None, "Python module to import so a custom model registers.", resource="module"
    )
    override_config: dict[str, Any] = _f({}, "Overrides of the model's config.json values.")
    trust_remote_code: bool = _f(False, "Allow custom model code from the model folder.")
    enable_gradient_checkpointing: bool = _f(True, "Recompute activations to save memory.")
    use_remove_padding: bool = _f(False, "Pack sequences without padding (rmpad).")
    lora_rank: int = _f(0, "LoRA rank; 0 trains all weights.", ge=0)
    lora_alpha: int = _f(16, "LoRA scaling alpha.")
    target_modules: str | list[str] = _f("all-linear", "Modules LoRA adapts.")
    hf_model: Any = _runtime("An already loaded model (or PEFT model) to train instead of path.")
    tokenizer: Any = _runtime("An already loaded tokenizer to use instead of tokenizer_path.")


@dataclass
class PolicyLossConfig(_Section):
    loss_mode: str = _f("vanilla", "Policy loss.", choices=POLICY_LOSS_MODES)
    clip_cov_ratio: float = _f(0.0002, "clip_cov: fraction of tokens clipped.")
    clip_cov_lb: float = _f(1.0, "clip_cov: lower covariance bound.")
    clip_cov_ub: float = _f(5.0, "clip_cov: upper covariance bound.")
    kl_cov_ratio: float = _f(0.0002, "kl_cov: fraction of tokens given a KL penalty.")
    ppo_kl_coef: float = _f(0.1, "kl_cov: coefficient of that KL penalty.")


@dataclass
class OptimConfig(_Section):
    lr: float = _f(1e-6, "Learning rate.", basic=True, gt=0)
    lr_warmup_steps: int = _f(-1, "Warm-up steps; -1: use lr_warmup_steps_ratio.", le=MAX_STEPS)
    lr_warmup_steps_ratio: float = _f(0.0, "Warm-up as a fraction of the total steps.", ge=0, le=1)
    min_lr_ratio: float = _f(0.0, "Cosine schedule floor as a fraction of lr.", ge=0, le=1)
    num_cycles: float = _f(0.5, "Cosine schedule cycles.")
    warmup_style: str = _f("constant", "Schedule after warm-up.", choices=("constant", "cosine"))
    weight_decay: float = _f(0.01, "AdamW weight decay.", ge=0)
    betas: list[float] = _f([0.9, 0.999], "AdamW betas.")
    total_training_steps: int = _f(
        -1, "Set by the trainer from the data; -1: not known yet.", le=MAX_STEPS
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


@dataclass
class CheckpointConfig(_Section):
    save_contents: list[str] = _f(
        ["model", "optimizer", "extra"], "What a checkpoint saves.", choices=CHECKPOINT_CONTENTS
    )
    load_contents: list[str] | None = _f(
        None, "What a resume loads; null: save_contents.", choices=CHECKPOINT_CONTENTS
    )


@dataclass
class ActorConfig(_Section):
    strategy: str = _f("fsdp2", "Training backend.", choices=STRATEGIES)
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
    entropy_coeff: float = _f(0.0, "Entropy bonus coefficient.", basic=True)
    use_kl_loss: bool = _f(False, "Add a KL-to-reference loss (GRPO).", basic=True)
    kl_loss_coef: float = _f(0.001, "Coefficient of the KL loss.", basic=True, ge=0)
    kl_loss_type: str = _f("low_var_kl", "KL estimator of the loss.", choices=KL_TYPES, basic=True)
    ppo_epochs: int = _f(1, "Passes over each batch.", gt=0)
    shuffle: bool = _f(False, "Shuffle samples between PPO epochs.")
    policy_loss: PolicyLossConfig = _section(PolicyLossConfig, "Policy loss variant.")
    optim: OptimConfig = _section(OptimConfig, "Actor optimizer.")
    fsdp_config: FSDPConfig = _section(FSDPConfig, "Actor FSDP settings.")
    checkpoint: CheckpointConfig = _section(CheckpointConfig, "Actor checkpoint contents.")


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
    fsdp_config: FSDPConfig = _section(FSDPConfig, "Reference model FSDP settings.")


@dataclass
class ValKwargsConfig(_Section):
    top_k: int = _f(-1, "Validation top-k; -1: off.")
    top_p: float = _f(1.0, "Validation nucleus sampling p.", gt=0, le=1)
    temperature: float = _f(0.0, "Validation temperature.", ge=0)
    n: int = _f(1, "Validation samples per prompt.", gt=0, le=MAX_BATCH)
    do_sample: bool = _f(False, "Sample in validation (False: greedy).")


@dataclass
class MultiTurnConfig(_Section):
    enable: bool = _f(False, "Run multi-turn conversations.")
    max_assistant_turns: int | None = _f(None, "Most assistant turns; null: no limit.", gt=0)
    max_user_turns: int | None = _f(None, "Most user turns; null: no limit.", gt=0)
    interaction_path: str | None = _f(
        None, "Python file defining the interaction.", resource="code"
    )
    interaction_name: str | None = _f(None, "Interaction class or function name.")


@dataclass
class RolloutConfig(_Section):
    name: str = _f("hf", "Generation backend.", choices=ROLLOUT_NAMES, basic=True)
    mode: str = _f("sync", "Rollout mode.", choices=("sync", "async"))
    temperature: float = _f(1.0, "Sampling temperature.", ge=0)
    top_k: int = _f(-1, "Top-k sampling; -1: off.")
    top_p: float = _f(1.0, "Nucleus sampling p.", gt=0, le=1)
    do_sample: bool = _f(True, "Sample (False: greedy).")
    n: int = _f(1, "Responses per prompt (GRPO group size).", basic=True, gt=0, le=MAX_BATCH)
    prompt_length: int | None = _f(None, "Null: data.max_prompt_length.", le=MAX_TOKENS)
    response_length: int | None = _f(None, "Null: data.max_response_length.", le=MAX_TOKENS)
    dtype: str = _f(
        "bfloat16", "Rollout weights dtype.", choices=("bfloat16", "float16", "float32")
    )
    gpu_memory_utilization: float = _f(0.5, "vLLM: fraction of GPU memory it may use.", gt=0, le=1)
    ignore_eos: bool = _f(False, "Keep generating after end-of-sequence.")
    enforce_eager: bool = _f(True, "vLLM: disable CUDA graphs.")
    free_cache_engine: bool = _f(True, "Free the KV cache while training.")
    enable_sleep_mode: bool = _f(True, "vLLM: sleep between rollouts to free memory.")
    tensor_model_parallel_size: int = _f(1, "vLLM tensor parallel size.", gt=0, le=MAX_WORKERS)
    max_num_batched_tokens: int = _f(
        8192, "vLLM: tokens per scheduler step.", gt=0, le=MAX_TOKEN_BUDGET
    )
    max_model_len: int | None = _f(
        None, "vLLM context length; null: prompt + response.", gt=0, le=MAX_TOKEN_BUDGET
    )
    max_num_seqs: int = _f(1024, "vLLM: sequences per scheduler step.", gt=0, le=MAX_BATCH)
    log_prob_micro_batch_size_per_gpu: int | None = _f(
        None,
        "Samples per old-log-prob forward per GPU; null: the whole per-GPU batch.",
        gt=0,
        le=MAX_BATCH,
    )
    log_prob_use_dynamic_bsz: bool | None = _f(None, "Null: actor.use_dynamic_bsz.")
    log_prob_max_token_len_per_gpu: int | None = _f(
        None, "Null: actor.ppo_max_token_len_per_gpu.", le=MAX_TOKEN_BUDGET
    )
    calculate_log_probs: bool = _f(False, "Return the rollout's own log-probs (for checks).")
    val_kwargs: ValKwargsConfig = _section(ValKwargsConfig, "Sampling during validation.")
    multi_turn: MultiTurnConfig = _section(MultiTurnConfig, "Multi-turn rollouts.")


@dataclass
class ActorRolloutRefConfig(_Section):
    hybrid_engine: bool = _f(True, "Actor, rollout and reference share devices.")
    model: ModelConfig = _section(ModelConfig, "The policy model.")
    actor: ActorConfig = _section(ActorConfig, "Policy training.")
    ref: RefConfig = _section(RefConfig, "The frozen reference policy.")
    rollout: RolloutConfig = _section(RolloutConfig, "Response generation.")


@dataclass
class CriticModelConfig(_Section):
    path: str | None = _f(
        None, "Critic model folder; null: the actor's model path.", resource="path"
    )
    tokenizer_path: str | None = _f(None, "Null: the actor's tokenizer.", resource="path")
    override_config: dict[str, Any] = _f({}, "Overrides of the critic's config.json values.")
    external_lib: str | None = _f(
        None, "Python module to import so a custom model registers.", resource="module"
    )
    trust_remote_code: bool = _f(False, "Allow custom model code from the model folder.")
    enable_gradient_checkpointing: bool = _f(True, "Recompute activations to save memory.")
    use_remove_padding: bool = _f(False, "Pack sequences without padding (rmpad).")
    fsdp_config: FSDPConfig = _section(FSDPConfig, "Critic FSDP settings.")


@dataclass
class CriticConfig(_Section):
    enable: bool | None = _f(None, "Train a value model; null: on for gae, off otherwise.")
    strategy: str | None = _f(None, "Null: actor.strategy.", choices=STRATEGIES)
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
    checkpoint: CheckpointConfig = _section(CheckpointConfig, "Critic checkpoint contents.")


@dataclass
class RewardModelModelConfig(_Section):
    path: str | None = _f(None, "Sequence-classification reward model folder.", resource="path")
    input_tokenizer: str | None = _f(
        None, "Tokenizer of the policy; null: the actor's model.", resource="path"
    )
    trust_remote_code: bool = _f(False, "Allow custom model code from the model folder.")


@dataclass
class RewardModelConfig(_Section):
    enable: bool = _f(False, "Score responses with a reward model.")
    model: RewardModelModelConfig = _section(RewardModelModelConfig, "The reward model.")
    micro_batch_size_per_gpu: int | None = _f(
        None, "Samples per forward per GPU.", gt=0, le=MAX_BATCH
    )
    max_length: int | None = _f(
        None, "Longest scored sequence; null: prompt + response.", gt=0, le=MAX_TOKEN_BUDGET
    )
    reward_manager: str = _f(
        "naive", "How rule rewards are computed.", choices=("naive", "batch", "parallel")
    )
    launch_reward_fn_async: bool = _f(False, "Compute rewards while log-probs are computed.")


@dataclass
class CustomRewardFunctionConfig(_Section):
    path: str | None = _f(None, "Python file with a reward function.", resource="code")
    name: str = _f("compute_score", "Function name in that file.")
    reward_kwargs: dict[str, Any] = _f({}, "Extra keyword arguments for the function.")


@dataclass
class RewardComponent(_Section):
    name: str = _f("", "Registered reward function.", choices=REWARD_COMPONENTS)
    weight: float = _f(1.0, "Weight in the sum.")
    kwargs: dict[str, Any] = _f({}, "Keyword arguments for the function.")


@dataclass
class RewardConfig(_Section):
    num_workers: int = _f(1, "Processes scoring responses in parallel.", gt=0, le=MAX_WORKERS)
    components: list[RewardComponent] = _f(
        [], "Weighted sum of rewards; empty: dispatch by data_source (or the custom function)."
    )


@dataclass
class KLControlConfig(_Section):
    type: str = _f("fixed", "KL coefficient controller.", choices=KL_CONTROLLER_TYPES)
    kl_coef: float = _f(0.001, "(Initial) coefficient of KL in the reward.", basic=True, ge=0)
    horizon: int = _f(10000, "adaptive: steps over which the coefficient adapts.", le=MAX_STEPS)
    target_kl: float = _f(0.1, "adaptive/pid: KL the controller aims for.")
    kp: float = _f(0.1, "pid: proportional gain on (kl - target_kl).")
    ki: float = _f(0.01, "pid: integral gain.")
    kd: float = _f(0.0, "pid: derivative gain.")


@dataclass
class PFPPOConfig(_Section):
    reweight_method: str = _f(
        "pow",
        "How a response's score weighs its chance to be drawn: pow |s|^weight_pow, max_min "
        "(only the batch's best and worst), max_random (best 0.4, others 0.1).",
        choices=PF_PPO_REWEIGHT_METHODS,
    )
    weight_pow: float = _f(2.0, "pow: the exponent of |score|.", ge=0)


@dataclass
class AlgorithmConfig(_Section):
    gamma: float = _f(1.0, "Discount factor.", ge=0, le=1)
    lam: float = _f(1.0, "GAE lambda.", ge=0, le=1)
    adv_estimator: str = _f("gae", "Advantage estimator.", choices=ADV_ESTIMATORS, basic=True)
    norm_adv_by_std_in_grpo: bool = _f(True, "Divide GRPO advantages by the group std.")
    use_kl_in_reward: bool = _f(False, "Subtract a KL penalty from the reward (PPO).", basic=True)
    kl_penalty: str = _f("kl", "KL estimator of the reward penalty.", choices=KL_TYPES)
    kl_ctrl: KLControlConfig = _section(KLControlConfig, "KL-in-reward coefficient control.")
    allow_single_sample_groups: bool = _f(False, "Let group estimators run with rollout.n=1.")
    use_pf_ppo: bool = _f(
        False,
        "PF-PPO (arXiv 2409.06957): update on the batch resampled, with replacement, by weights "
        "of the responses' scores.",
    )
    pf_ppo: PFPPOConfig = _section(PFPPOConfig, "PF-PPO's resampling weights.")


@dataclass
class TrainerConfig(_Section):
    total_epochs: int = _f(30, "Passes over the training data.", basic=True, gt=0, le=MAX_EPOCHS)
    total_training_steps: int | None = _f(
        None, "Stop after this many steps.", basic=True, gt=0, le=MAX_STEPS
    )
    project_name: str = _f("posttrain", "Project the run belongs to.", basic=True)
    experiment_name: str = _f("default", "Name of the run.", basic=True)
    logger: list[str] = _f(["console"], "Metric sinks.", choices=("console", "jsonl"))
    log_val_generations: int = _f(
        0, "Validation samples logged per validation.", ge=0, le=MAX_BATCH
    )
    log_freq: int = _f(
        1,
        "The console logger prints every N steps (metrics record every step).",
        gt=0,
        le=MAX_STEPS,
    )
    nnodes: int = _f(1, "Machines.", gt=0, le=MAX_WORKERS)
    n_gpus_per_node: int = _f(
        8,
        "Worker processes per machine (GPUs, or CPU ranks).",
        basic=True,
        gt=0,
        le=MAX_WORKERS,
    )
    device: str = _f(
        "auto", "auto: cuda when visible.", choices=("auto", "cpu", "cuda"), basic=True
    )
    controller: str = _f(
        "local", "Run workers in-process or as Ray actors.", choices=("local", "ray")
    )
    balance_batch: bool = _f(True, "Balance tokens across data-parallel ranks.")
    save_freq: int = _f(-1, "Checkpoint every N steps; -1: never.", basic=True, le=MAX_STEPS)
    resume_mode: str = _f("auto", "Resume source.", choices=("auto", "disable", "resume_path"))
    resume_from_path: str | None = _f(
        None, "Checkpoint folder (resume_mode=resume_path).", resource="path"
    )
    test_freq: int = _f(-1, "Validate every N steps; -1: never.", basic=True, le=MAX_STEPS)
    val_before_train: bool = _f(True, "Validate before the first step.")
    val_only: bool = _f(False, "Validate and stop.")
    critic_warmup: int = _f(0, "Steps training only the critic.", ge=0, le=MAX_STEPS)
    default_local_dir: str = _f(
        "checkpoints/${trainer.project_name}/${trainer.experiment_name}",
        "Checkpoint folder.",
        resource="server",
    )
    max_actor_ckpt_to_keep: int | None = _f(
        None, "Actor checkpoints kept; null: all.", gt=0, le=MAX_STEPS
    )
    max_critic_ckpt_to_keep: int | None = _f(
        None, "Critic checkpoints kept; null: all.", gt=0, le=MAX_STEPS
    )
    seed: int = _f(1, "Seed of sampling and initialisation.")


@dataclass
class RayInitConfig(_Section):
    num_cpus: int | None = _f(None, "CPUs Ray may use; null: all.", gt=0, resource="server")
    address: str | None = _f(
        None, "Ray cluster address; null: RAY_ADDRESS or a local head.", resource="server"
    )
    include_dashboard: bool = _f(False, "Start Ray's dashboard.", resource="server")


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
    extras: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "Keys added with +key=value that PostTrain does not know.",
            "extras": True,
        },
    )
