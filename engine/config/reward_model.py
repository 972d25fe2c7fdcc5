"""The reward model: verl's ``reward_model`` section (the learned reward model or a generative
judge, and the keys of its reward manager that verl keeps there), and the rules of the model
itself.

The rules here are what the model's folder must hold and where it runs: ``own_reward_pool``,
``reward_pool_problems`` and ``in_process_reward_model_problems`` are also asked by the trainers
as they start, so the form, the CLI and the trainer give the same error. How the model combines
with the other rewards, and what each reward manager reads, are ``engine.config.reward``'s.
"""

import json
from dataclasses import dataclass
from typing import Any, Protocol

from engine.config.fields import (
    MAX_BATCH,
    MAX_TOKEN_BUDGET,
    MAX_WORKERS,
    ConfigFieldError,
    Validation,
    _f,
    _inert,
    _refused,
    _Section,
    _section,
    _target,
    _ulysses,
)
from engine.config.files import local_path, model_dir_problems
from engine.config.judge import JudgeConfig, causal_lm_problems
from engine.config.unsupported import ProfilerConfig, RewardModelRolloutConfig, WrapPolicyConfig
from engine.rewards.names import REWARD_MANAGERS

_RM_ONLY = "read only with reward_model.enable=True"


@dataclass
class RewardModelFSDPConfig(_Section):
    _target_: str = _target("verl.workers.config.FSDPEngineConfig")
    wrap_policy: WrapPolicyConfig = _section(WrapPolicyConfig, "Which modules FSDP wraps.")
    param_offload: bool = _f(
        False,
        "Keep the reward model's parameters on the CPU between forwards, on a GPU (FSDP2's "
        "offload on Ray ranks; the single-process trainer moves its classifier to the GPU for "
        "each scoring). An error on a CPU, and for a generative judge under the local "
        "controller.",
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
        "(tiny://reward_model: the embedded one), or with reward_model.judge.prompt_template a "
        "causal LM that judges each response (tiny://model for a trial).",
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
    override_config: dict[str, Any] = _inert(
        {}, f"Model config attribute overrides ({_RM_ONLY}); checked as the policy's."
    )
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
class SandboxFusionConfig(_Section):
    url: str | None = _f(
        None,
        "Run the code reward's stdin/stdout tests on this SandboxFusion service (verl's "
        "run_code API) instead of the local bubblewrap sandbox: the name or URL of an entry of "
        "the administrator's POSTTRAIN_REWARD_ENDPOINTS; null: the local sandbox.",
        resource="endpoint",
    )
    max_concurrent: int = _f(
        64, "Tests of one response posted to SandboxFusion at once.", gt=0, le=MAX_WORKERS
    )
    memory_limit_mb: int = _f(
        1024,
        "Memory of each program on SandboxFusion, in MiB (at most the local sandbox's "
        "POSTTRAIN_SANDBOX_MEMORY_MB ceiling).",
        gt=0,
        le=1 << 20,
    )


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
        "Samples per reward-model forward (per rank with trainer.controller=ray); null with "
        "use_reward_loop: reward_model.rollout.max_num_seqs. Needed with use_reward_loop=False "
        "(or micro_batch_size), as verl's reward model worker needs it.",
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
        "**reward_kwargs) returning a score per response) or remote (the batch posted as "
        "JSON to reward_kwargs.endpoint, a reward service the administrator lists in "
        "POSTTRAIN_REWARD_ENDPOINTS).",
        choices=REWARD_MANAGERS,
    )
    reward_kwargs: dict[str, Any] = _f(
        {},
        "Keyword arguments of the reward manager, set as verl's +reward_model.reward_kwargs.*: "
        "dapo reads max_resp_len and overlong_buffer_cfg {enable, len, penalty_factor, log}; "
        "prime reads timeout (seconds per response, default 300); batch passes them all to "
        "custom_reward_function; remote reads endpoint (an entry of "
        "POSTTRAIN_REWARD_ENDPOINTS, by name or URL), timeout (s per request, 30), "
        "max_retries (2), backoff_s (0.5), max_concurrent (4), max_rpm (null), batch_size (64) "
        "and on_error (reward_error or fail); naive takes none.",
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
    sandbox_fusion: SandboxFusionConfig = _section(
        SandboxFusionConfig, "verl's SandboxFusion code runner, for the code reward."
    )
    ulysses_sequence_parallel_size: int = _ulysses()
    use_reward_loop: bool = _f(
        True,
        "verl's reward loop (its default): the reward model needs no micro_batch_size_per_gpu "
        "and scores reward_model.rollout.max_num_seqs samples per forward, the sequences its "
        "server takes per step. verl serves it through the rollout backend (reward_model."
        "rollout.*); here the same one-label classifier scores in the trainer (or on its Ray "
        "ranks) with transformers, so the server's keys have no effect. False: verl's legacy "
        "reward model worker, which needs micro_batch_size_per_gpu.",
    )
    num_workers: int = _inert(1, "Reward loop workers (the engine's: reward.num_workers).")
    rollout: RewardModelRolloutConfig = _section(
        RewardModelRolloutConfig, "A generative reward model's server."
    )
    profiler: ProfilerConfig = _section(ProfilerConfig, "Profiling of the reward model.")
    judge: JudgeConfig = _section(
        JudgeConfig, "A generative reward model (LLM-as-judge): its prompt and score parser."
    )
    max_rpm: float | None = _f(
        None,
        "Judge requests a minute, as verl's rate_limited reward manager (+reward_model.max_rpm); "
        "null: unlimited.",
        gt=0,
    )
    max_tpm: float | None = _f(
        None,
        "Judge tokens a minute, counted as estimated_tokens_per_request a request, as verl's "
        "rate_limited reward manager; null: unlimited.",
        gt=0,
    )
    estimated_tokens_per_request: int = _f(
        2000, "Tokens a judge request counts against max_tpm (verl's estimate).", gt=0
    )
    timeout: float = _f(
        300.0,
        "Seconds the judge may take over one batch of responses (verl's rate_limited manager: "
        "per request); the samples it has not reached by then are reward errors.",
        gt=0,
    )


def reward_model_folder_problems(v: Validation) -> list[ConfigFieldError]:
    """Return the errors of the reward model's folder, when files are checked: a model folder, and
    a causal LM for a judge or a one-label sequence classifier otherwise."""
    rm: RewardModelConfig = v.cfg.reward_model
    if not (v.check_files and rm.enable and rm.model.path):
        return []
    errors = model_dir_problems(v, "reward_model.model.path", rm.model.path)
    if uses_judge(v.cfg):
        return errors + causal_lm_problems(v, rm.model.path)
    return errors + _classifier_problems(v, rm.model.path)


def _classifier_problems(v: Validation, value: str) -> list[ConfigFieldError]:
    """Return an error when a local reward model folder is not a one-label sequence classifier."""
    path = local_path(v, "reward_model.model.path", value)
    if path is None or not (path / "config.json").is_file():
        return []  # remote, tiny://, or already reported by model_dir_problems
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        return [
            ConfigFieldError(
                "reward_model.model.path", value, f"{path}/config.json cannot be read: {exc}"
            )
        ]
    architectures = config.get("architectures") or []
    labels = len(config["id2label"]) if "id2label" in config else config.get("num_labels", 2)
    if not any(a.endswith("ForSequenceClassification") for a in architectures) or labels != 1:
        return [
            ConfigFieldError(
                "reward_model.model.path",
                value,
                f"{path} is not a one-label sequence classifier (architectures={architectures}, "
                f"{labels} labels); point it at a reward model saved from "
                "AutoModelForSequenceClassification with num_labels=1, or use tiny://reward_model",
            )
        ]
    return []


class WithRewardModel(Protocol):
    """A config holding a ``reward_model`` section: the root ``PPOConfig``, which this module
    sits below (``engine.config.schema`` imports it)."""

    reward_model: RewardModelConfig


def own_reward_pool(cfg: WithRewardModel) -> bool:
    """Return True when the reward model runs on a Ray pool of its own (verl's ``reward_pool``)."""
    return bool(cfg.reward_model.enable and cfg.reward_model.enable_resource_pool)


def reward_pool_problems(cfg: WithRewardModel) -> list[ConfigFieldError]:
    """Return an error for each of ``reward_model.nnodes`` and ``n_gpus_per_node`` below 1 when
    the reward model has a pool of its own, as verl's ``main_ppo`` refuses them.

    ``RayPPOTrainer`` raises them too, before it asks Ray for the pools.
    """
    if not own_reward_pool(cfg):
        return []
    rm = cfg.reward_model
    return [
        ConfigFieldError(
            f"reward_model.{name}",
            value,
            "reward_model.enable_resource_pool=True gives the reward model a pool of "
            f"reward_model.nnodes x reward_model.n_gpus_per_node ranks, but they are {rm.nnodes} "
            f"x {rm.n_gpus_per_node}; set both to at least 1, or "
            "reward_model.enable_resource_pool=False to share the trainer's ranks",
        )
        for name, value in (("nnodes", rm.nnodes), ("n_gpus_per_node", rm.n_gpus_per_node))
        if value < 1
    ]


IN_PROCESS_OFFLOAD_ON_CPU = (
    "keeps the reward model in CPU memory between scorings to give a GPU's memory back to "
    "training, but trainer.device=cpu has no GPU memory to give back; set it False"
)


def in_process_reward_model_problems(
    cfg: WithRewardModel, device: str | None = None
) -> list[ConfigFieldError]:
    """Return an error for each reward-model key the single-process trainer cannot honour: it
    loads the reward model whole in its own process.

    ``enable_resource_pool`` places the Ray role. ``model.fsdp_config.param_offload`` is
    honoured for a classifier (its parameters wait in CPU memory between scorings) on a GPU
    only: on ``device`` (``trainer.device``, or the resolved device when the run starts) ``cpu``
    it would change nothing. A generative judge generates through a rollout backend, which has
    no such offload. The validator asks with ``trainer.controller=local``;
    ``build_reward_scorer`` raises them before it loads the model.
    """
    rm = cfg.reward_model
    if not rm.enable:
        return []
    offload_key = "reward_model.model.fsdp_config.param_offload"
    offload, judge = rm.model.fsdp_config.param_offload, uses_judge(cfg)
    ray_only = {"reward_model.enable_resource_pool": rm.enable_resource_pool}
    if judge:
        ray_only[offload_key] = offload
    problems = [
        ConfigFieldError(
            key,
            value,
            "read where the reward model is a role on Ray ranks, but the single-process trainer "
            "(trainer.controller=local) loads it whole in its own process; set "
            f"trainer.controller=ray, or {key}=False",
        )
        for key, value in ray_only.items()
        if value
    ]
    if offload and not judge and device == "cpu":
        problems.append(ConfigFieldError(offload_key, True, IN_PROCESS_OFFLOAD_ON_CPU))
    return problems


def uses_judge(cfg: WithRewardModel) -> bool:
    """Return True when the reward model is a generative judge (``reward_model.judge``)."""
    return bool(cfg.reward_model.enable and cfg.reward_model.judge.prompt_template)
