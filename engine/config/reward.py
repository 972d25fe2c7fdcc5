"""The rewards: ``reward_model`` (verl's learned reward model and reward manager),
``custom_reward_function``, PostTrain's ``reward`` composition and verl 0.7's ``reward_manager``.
"""

from dataclasses import dataclass
from typing import Any

from engine.config.fields import (
    MAX_BATCH,
    MAX_TOKEN_BUDGET,
    MAX_WORKERS,
    _f,
    _inert,
    _refused,
    _Section,
    _section,
    _target,
    _ulysses,
)
from engine.config.unsupported import (
    ModuleConfig,
    ProfilerConfig,
    RewardModelRolloutConfig,
    SandboxFusionConfig,
    WrapPolicyConfig,
)
from engine.rewards.names import REWARD_COMPONENTS, REWARD_MANAGERS

_RM_ONLY = "read only with reward_model.enable=True"


@dataclass
class RewardModelFSDPConfig(_Section):
    _target_: str = _target("verl.workers.config.FSDPEngineConfig")
    wrap_policy: WrapPolicyConfig = _section(WrapPolicyConfig, "Which modules FSDP wraps.")
    param_offload: bool = _f(
        False,
        "Keep the reward model's parameters on the CPU between forwards (trainer.controller=ray "
        "on a GPU; an error on a CPU or with trainer.controller=local).",
    )
    reshard_after_forward: bool = _f(
        True,
        "Free the gathered parameters after each forward (trainer.controller=ray); False keeps "
        "them whole on every rank between forwards.",
    )
    fsdp_size: int = _f(
        -1,
        "Ranks per FSDP shard group of the reward model's pool (trainer.controller=ray); -1: "
        "all, a divisor: shard within groups of that many ranks, replicate across them.",
    )
    forward_prefetch: bool = _inert(False, "Prefetch the next FSDP unit in forward.")


@dataclass
class RewardModelModelConfig(_Section):
    path: str | None = _f(
        None,
        "Reward model folder: a sequence classifier with one label, whose logit is the score "
        "(tiny://reward_model: the embedded one).",
        resource="path",
    )
    input_tokenizer: str | None = _inert(
        None,
        "Tokenizer of the policy; null: the actor's. Not needed here: the response is decoded "
        "with the policy's tokenizer and the prompt's chat messages (raw_prompt) are rendered "
        "with the reward model's own chat template.",
        resource="path",
        follows="actor_rollout_ref.model.path",
    )
    trust_remote_code: bool = _f(False, "Load the reward model's own code from its folder.")
    external_lib: str | None = _inert(
        None,
        f"Module registering a custom model ({_RM_ONLY}).",
        resource="module",
        follows="actor_rollout_ref.model.external_lib",
    )
    override_config: dict[str, Any] = _inert({}, f"config.json overrides ({_RM_ONLY}).")
    use_shm: bool = _inert(False, "Copy the weights through shared memory first.")
    use_remove_padding: bool = _inert(False, f"Padding-free forward ({_RM_ONLY}).")
    use_fused_kernels: bool | None = _inert(
        None, "Use verl's fused kernels.", follows="actor_rollout_ref.model.use_fused_kernels"
    )
    fsdp_config: RewardModelFSDPConfig = _section(
        RewardModelFSDPConfig, "Reward model FSDP settings."
    )


@dataclass
class OverlongBufferConfig(_Section):
    enable: bool = _f(
        False,
        "DAPO's overlong penalty as verl's DAPO recipe spells it (reward_manager=dapo); the "
        "response limit is data.max_response_length.",
    )
    len: int = _f(0, "Tokens before the response limit where the penalty starts.", ge=0)
    penalty_factor: float = _f(0.0, "Penalty of a response at the limit.", ge=0)
    log: bool = _f(False, "Record overlong_reward and overlong for each response.")


@dataclass
class RewardModelConfig(_Section):
    enable: bool = _f(
        False,
        "Score responses with the reward model (model.path): in the trainer's process, or with "
        "trainer.controller=ray as a role sharded by FSDP2 over its pool's ranks. With no "
        "reward.components its score is the reward (as verl), else a reward_model component "
        "weighs it against rule rewards.",
    )
    model: RewardModelModelConfig = _section(RewardModelModelConfig, "The reward model.")
    micro_batch_size_per_gpu: int | None = _f(
        None,
        "Samples per reward-model forward (per rank with trainer.controller=ray); needed with "
        "enable=True (or micro_batch_size).",
        gt=0,
        le=MAX_BATCH,
    )
    max_length: int | None = _f(
        None,
        "Longest scored sequence in the reward model's tokens (the start is cut); null: "
        "data.max_prompt_length + data.max_response_length.",
        gt=0,
        le=MAX_TOKEN_BUDGET,
    )
    reward_manager: str = _f(
        "naive",
        "How rule rewards are computed: naive (one score per response, reward.num_workers in "
        "parallel), dapo (naive plus verl's DAPO overlong penalty from reward_kwargs, and each "
        "float score recorded as acc), prime (naive in reward.num_workers worker processes, "
        "each response scoring 0 past reward_kwargs.timeout seconds, default 300, or if its "
        "worker dies) or batch (one call of custom_reward_function for the whole batch: "
        "compute_score(data_sources, solution_strs, ground_truths, extra_infos, "
        "**reward_kwargs) returning a score per response).",
        choices=REWARD_MANAGERS,
    )
    reward_kwargs: dict[str, Any] = _f(
        {},
        "Keyword arguments of the reward manager, set as verl's +reward_model.reward_kwargs.*: "
        "dapo reads max_resp_len and overlong_buffer_cfg {enable, len, penalty_factor, log}; "
        "prime reads timeout (seconds per response, default 300); batch passes them all to "
        "custom_reward_function; naive takes none.",
    )
    overlong_buffer: OverlongBufferConfig = _section(
        OverlongBufferConfig, "verl's DAPO recipe spelling of reward_kwargs.overlong_buffer_cfg."
    )
    launch_reward_fn_async: bool = _inert(False, "Compute rewards while log-probs are computed.")
    enable_resource_pool: bool = _f(
        False,
        "Run the reward model on a Ray resource pool of its own (reward_pool: nnodes x "
        "n_gpus_per_node ranks) instead of the global pool; needs trainer.controller=ray.",
    )
    n_gpus_per_node: int = _f(
        8,
        "Ranks per node of the reward model's own pool (GPUs, or CPU ranks); read with "
        "enable_resource_pool=True.",
        ge=0,
        le=MAX_WORKERS,
    )
    nnodes: int = _f(
        0,
        "Nodes of the reward model's own pool; at least 1 with enable_resource_pool=True.",
        ge=0,
        le=MAX_WORKERS,
    )
    strategy: str = _inert("fsdp", f"Backend of the reward model ({_RM_ONLY}).")
    micro_batch_size: int | None = _f(
        None,
        "Samples per reward-model forward over all its ranks (verl's deprecated global size): "
        "divided into micro_batch_size_per_gpu by the ranks of its own pool with "
        "enable_resource_pool=True, else by trainer.nnodes x trainer.n_gpus_per_node.",
        gt=0,
        le=MAX_BATCH,
    )
    use_dynamic_bsz: bool | None = _inert(
        None, f"Token-budget micro-batches ({_RM_ONLY}).", follows="critic.use_dynamic_bsz"
    )
    forward_max_token_len_per_gpu: int | None = _inert(
        None,
        f"Token budget per micro-batch ({_RM_ONLY}).",
        le=MAX_TOKEN_BUDGET,
        follows="critic.forward_max_token_len_per_gpu",
    )
    reward_loop_source: str = _inert("register", f"Where the reward loop comes from ({_RM_ONLY}).")
    reward_loop_module_path: str | None = _refused(
        None,
        "Python file with a custom reward loop.",
        "custom reward loops are not loaded; write a custom_reward_function",
        resource="code",
    )
    reward_loop_class_name: str | None = _refused(
        None,
        "Class of the custom reward loop.",
        "custom reward loops are not loaded; write a custom_reward_function",
    )
    sandbox_fusion: SandboxFusionConfig = _section(SandboxFusionConfig, "SandboxFusion server.")
    ulysses_sequence_parallel_size: int = _ulysses()
    use_reward_loop: bool = _inert(True, "verl's asynchronous reward loop.")
    num_workers: int = _inert(1, "Reward loop workers (the engine's: reward.num_workers).")
    rollout: RewardModelRolloutConfig = _section(
        RewardModelRolloutConfig, "A generative reward model's server."
    )
    profiler: ProfilerConfig = _section(ProfilerConfig, "Profiling of the reward model.")


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
class RewardManagerConfig(_Section):
    _target_: str = _target("verl.trainer.config.config.RewardManagerConfig")
    source: str = _refused(
        "register",
        "Where the reward manager comes from: register or importlib.",
        "only registered reward managers exist here; keep register",
    )
    name: str | None = _f(
        None,
        "Reward manager; null: reward_model.reward_manager.",
        follows="reward_model.reward_manager",
    )
    module: ModuleConfig = _section(ModuleConfig, "A custom reward manager module.")


def own_reward_pool(cfg: Any) -> bool:
    """Return True when the reward model runs on a Ray pool of its own (verl's ``reward_pool``)."""
    return bool(cfg.reward_model.enable and cfg.reward_model.enable_resource_pool)
