"""The rewards: ``reward_model`` (verl's learned reward model and reward manager),
``custom_reward_function``, PostTrain's ``reward`` composition and verl 0.7's ``reward_manager``.

The rules are at the end: what the reward model needs, how the components combine with the reward
model and the custom function, what each reward manager reads (its ``reward_kwargs``, DAPO's
overlong penalty), and the reward model's own Ray pool. ``own_reward_pool``,
``reward_pool_problems`` and ``in_process_reward_model_problems`` are also asked by the trainers
as they start, so the form, the CLI and the trainer give the same error.
"""

import json
import math
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
from engine.config.files import file_problems, local_path, model_dir_problems
from engine.config.judge import JudgeConfig, causal_lm_problems, judge_problems
from engine.config.reward_kwargs import reward_kwargs_problems
from engine.config.tree import get_in
from engine.config.unsupported import (
    ModuleConfig,
    ProfilerConfig,
    RewardModelRolloutConfig,
    WrapPolicyConfig,
)
from engine.rewards.endpoints import endpoint_problem
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


def reward_problems(v: Validation) -> list[ConfigFieldError]:
    """Return the errors of the reward keys: what the reward model needs, how the components, the
    reward model and the custom function combine, what the reward manager reads, and the reward
    model's pool; warn when DAPO's overlong penalty can never apply."""
    cfg = v.cfg
    rm: RewardModelConfig = cfg.reward_model
    custom: CustomRewardFunctionConfig = cfg.custom_reward_function
    errors = []
    if rm.enable and not rm.model.path:
        errors.append(
            ConfigFieldError(
                "reward_model.model.path",
                rm.model.path,
                "reward_model.enable=True needs a reward model folder (tiny://reward_model: the "
                "embedded one)",
            )
        )
    if rm.enable and rm.micro_batch_size_per_gpu is None and not rm.use_reward_loop:
        errors.append(
            ConfigFieldError(
                "reward_model.micro_batch_size_per_gpu",
                None,
                "verl's legacy reward model worker (use_reward_loop=False) needs the samples "
                "per reward-model forward; set reward_model.micro_batch_size_per_gpu (or verl's "
                "deprecated micro_batch_size), or use the reward loop (use_reward_loop=True)",
            )
        )
    if rm.enable and custom.path and not cfg.reward.components:
        errors.append(
            ConfigFieldError(
                "reward.components",
                cfg.reward.components,
                "reward_model.enable=True and custom_reward_function.path both give the reward; "
                "combine them with reward.components=[{name: custom, weight: ...}, {name: "
                "reward_model, weight: ...}], or drop one",
            )
        )
    errors += _component_problems(v)
    errors += reward_pool_problems(cfg)
    if cfg.trainer.controller != "ray":
        errors += in_process_reward_model_problems(cfg)
    errors += _manager_problems(v)
    errors += _reward_kwargs_problems(v)
    errors += _sandbox_fusion_problems(v)
    errors += judge_problems(v)
    if v.check_files and rm.enable and rm.model.path:
        errors += model_dir_problems(v, "reward_model.model.path", rm.model.path)
        if uses_judge(cfg):
            errors += causal_lm_problems(v, rm.model.path)
        else:
            errors += _classifier_problems(v, rm.model.path)
    if v.check_files and custom.path:
        errors += file_problems(
            v, "custom_reward_function.path", custom.path, "point it at a Python file"
        )
    return errors


def _component_problems(v: Validation) -> list[ConfigFieldError]:
    """Return the errors of ``reward.components``: each one's weight and what its name needs, and
    a custom function or a reward model that no component scores with."""
    cfg = v.cfg
    errors = []
    for i, component in enumerate(cfg.reward.components):
        key = f"reward.components[{i}]"
        if not math.isfinite(component.weight):
            errors.append(
                ConfigFieldError(f"{key}.weight", component.weight, "must be a finite number")
            )
        if component.name == "custom" and not cfg.custom_reward_function.path:
            errors.append(
                ConfigFieldError(
                    f"{key}.name",
                    "custom",
                    "custom needs custom_reward_function.path (a Python file)",
                )
            )
        if component.name == "reward_model" and not cfg.reward_model.enable:
            errors.append(
                ConfigFieldError(
                    f"{key}.name", "reward_model", "reward_model needs reward_model.enable=True"
                )
            )
        if component.name == "reward_model" and component.kwargs:
            errors.append(
                ConfigFieldError(
                    f"{key}.kwargs",
                    component.kwargs,
                    "a reward-model component takes no kwargs: the model scores each (prompt, "
                    "response) pair as it is; remove them",
                )
            )
    names = {component.name for component in cfg.reward.components}
    if names and cfg.custom_reward_function.path and "custom" not in names:
        errors.append(
            ConfigFieldError(
                "custom_reward_function.path",
                cfg.custom_reward_function.path,
                "is set, but reward.components has no custom component, so the function would "
                "score nothing; add {name: custom, weight: ...} to reward.components, or unset "
                "custom_reward_function.path",
            )
        )
    if names and cfg.reward_model.enable and "reward_model" not in names:
        errors.append(
            ConfigFieldError(
                "reward_model.enable",
                True,
                "loads the reward model, but reward.components has no reward_model component, so "
                "its score would count nowhere; add {name: reward_model, weight: ...} to "
                "reward.components, or set reward_model.enable=False",
            )
        )
    return errors


def _manager_problems(v: Validation) -> list[ConfigFieldError]:
    """Return the errors of what the prime and batch managers score with: one function, and
    batch's one call."""
    cfg = v.cfg
    manager = cfg.reward_model.reward_manager
    if manager not in ("prime", "batch", "remote"):
        return []
    which, errors = f"reward_model.reward_manager={manager}", []
    scores_with = {
        "prime": "one reward function (custom_reward_function or the data_source dispatch)",
        "batch": "one reward function (custom_reward_function)",
        "remote": "its reward service (reward_kwargs.endpoint)",
    }[manager]
    if cfg.reward.components:
        errors.append(
            ConfigFieldError(
                "reward.components",
                cfg.reward.components,
                f"are not read by {which}, which scores with {scores_with}; weighted "
                "components need reward_model.reward_manager=naive or dapo",
            )
        )
    if cfg.reward_model.enable:
        errors.append(
            ConfigFieldError(
                "reward_model.enable",
                True,
                f"loads the reward model, which {which} does not score with; use "
                "reward_model.reward_manager=naive (the model's score is the reward) or dapo",
            )
        )
    if manager == "remote":
        return errors + _remote_manager_problems(v)
    if manager != "batch":
        return errors
    custom = cfg.custom_reward_function
    if not custom.path:
        errors.append(
            ConfigFieldError(
                "reward_model.reward_manager",
                manager,
                "batch calls custom_reward_function once per batch; set "
                "custom_reward_function.path and .name to a function compute_score(data_sources, "
                "solution_strs, ground_truths, extra_infos, **kwargs) returning one score per "
                "response",
            )
        )
    if cfg.reward.num_workers != 1:
        errors.append(
            ConfigFieldError(
                "reward.num_workers",
                cfg.reward.num_workers,
                "has no effect with reward_model.reward_manager=batch, which makes one call in "
                "the trainer's process (a batch function parallelises itself); set it to 1",
            )
        )
    for key in sorted(cfg.reward_model.reward_kwargs.keys() & (custom.reward_kwargs or {}).keys()):
        errors.append(
            ConfigFieldError(
                f"reward_model.reward_kwargs.{key}",
                cfg.reward_model.reward_kwargs[key],
                "is also set in custom_reward_function.reward_kwargs, and batch passes both to "
                "the function; keep one",
            )
        )
    return errors


def _sandbox_fusion_problems(v: Validation) -> list[ConfigFieldError]:
    """Return the errors of ``reward_model.sandbox_fusion.url``: an allowed service, read by a
    manager whose code reward runs tests."""
    cfg, key = v.cfg, "reward_model.sandbox_fusion.url"
    url = cfg.reward_model.sandbox_fusion.url
    if url is None:
        return []
    why = endpoint_problem(url)
    if why is not None:
        return [ConfigFieldError(key, url, why)]
    manager = cfg.reward_model.reward_manager
    if manager in ("batch", "remote"):
        return [
            ConfigFieldError(
                key,
                url,
                f"is read by the code reward, which reward_model.reward_manager={manager} does "
                "not call; use naive, dapo or prime, or unset the url",
            )
        ]
    return []


def _remote_manager_problems(v: Validation) -> list[ConfigFieldError]:
    """Return the errors of what the remote manager does not read: a custom function and
    reward.num_workers (its requests are threads, bounded by reward_kwargs.max_concurrent)."""
    cfg, errors = v.cfg, []
    if cfg.custom_reward_function.path:
        errors.append(
            ConfigFieldError(
                "custom_reward_function.path",
                cfg.custom_reward_function.path,
                "is not called by reward_model.reward_manager=remote, which scores with its "
                "reward service; unset it, or use reward_manager=batch to call the function",
            )
        )
    if cfg.reward.num_workers != 1:
        errors.append(
            ConfigFieldError(
                "reward.num_workers",
                cfg.reward.num_workers,
                "has no effect with reward_model.reward_manager=remote, whose requests in "
                "flight are +reward_model.reward_kwargs.max_concurrent; set it to 1",
            )
        )
    return errors


def _reward_kwargs_problems(v: Validation) -> list[ConfigFieldError]:
    """Return the errors of ``reward_model.reward_kwargs`` for its manager, and of DAPO's overlong
    penalty as verl's recipe spells it (``reward_model.overlong_buffer``)."""
    cfg = v.cfg
    manager = cfg.reward_model.reward_manager
    kwargs = dict(cfg.reward_model.reward_kwargs)
    problems = reward_kwargs_problems(manager, kwargs)
    errors = [
        ConfigFieldError(key, get_in(kwargs, key.split(".")[2:])[1], message)
        for key, message in problems
    ]
    buffer = kwargs.get("overlong_buffer_cfg") or {}
    longest = cfg.data.max_response_length
    start = kwargs.get("max_resp_len", 0) - buffer.get("len", 0)
    if not problems and manager == "dapo" and buffer.get("enable") and start >= longest:
        v.warnings.append(
            f"reward_model.reward_kwargs: the overlong penalty starts after max_resp_len - len "
            f"= {start} tokens, but no response is longer than data.max_response_length="
            f"{longest}, so it never applies"
        )
    recipe, key = cfg.reward_model.overlong_buffer, "reward_model.overlong_buffer"
    if recipe.enable and manager != "dapo":
        errors.append(
            ConfigFieldError(
                f"{key}.enable", True, "is read by reward_model.reward_manager=dapo; set it"
            )
        )
    if recipe.enable and buffer.get("enable"):
        errors.append(
            ConfigFieldError(
                f"{key}.enable",
                True,
                "and reward_model.reward_kwargs.overlong_buffer_cfg are two spellings of one "
                "penalty; keep one",
            )
        )
    if recipe.enable and not 0 < recipe.len <= longest:
        errors.append(
            ConfigFieldError(
                f"{key}.len",
                recipe.len,
                f"must be > 0 and at most data.max_response_length={longest} when enabled",
            )
        )
    return errors


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


def in_process_reward_model_problems(cfg: WithRewardModel) -> list[ConfigFieldError]:
    """Return an error for each reward-model key that only its Ray role reads, set True: the
    single-process trainer loads the reward model whole in its own process.

    The validator asks with ``trainer.controller=local``; ``build_reward_scorer`` raises them
    before it loads the model.
    """
    rm = cfg.reward_model
    if not rm.enable:
        return []
    ray_only = {
        "reward_model.enable_resource_pool": rm.enable_resource_pool,
        "reward_model.model.fsdp_config.param_offload": rm.model.fsdp_config.param_offload,
    }
    return [
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


def uses_judge(cfg: WithRewardModel) -> bool:
    """Return True when the reward model is a generative judge (``reward_model.judge``)."""
    return bool(cfg.reward_model.enable and cfg.reward_model.judge.prompt_template)
