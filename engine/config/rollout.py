"""``actor_rollout_ref.rollout``: how responses are generated (the backend, sampling, lengths,
validation sampling and multi-turn conversations with tools).

verl's ``RolloutConfig`` (``verl/workers/config/rollout.py``). The rules are at the end: the
backend against the machine, group sizes for group estimators, sampling, multi-turn files.
"""

import importlib.util
from dataclasses import dataclass
from typing import Any

from engine.algorithms.names import GROUP_ESTIMATORS
from engine.config.fields import (
    MAX_BATCH,
    MAX_TOKEN_BUDGET,
    MAX_TOKENS,
    MAX_WORKERS,
    ConfigFieldError,
    Validation,
    _f,
    _global_micro_batch,
    _inert,
    _refused,
    _Section,
    _section,
    _target,
    resolved,
)
from engine.config.files import file_problems
from engine.config.unsupported import (
    AgentLoopConfig,
    MtpConfig,
    ProfilerConfig,
    PrometheusConfig,
    SGLangServerConfig,
    TraceConfig,
)
from engine.rollout.names import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    ROLLOUT_NAMES,
    SANITY_CHECK_MODES,
    SGLANG_MISSING,
    TOOL_CALL_FORMATS,
    TRUNCATE_SIDES,
    VLLM_MISSING,
)


@dataclass
class EngineKwargsConfig(_Section):
    vllm: dict[str, Any] = _f(
        {},
        "Extra keyword arguments of vllm.LLM (rollout.name=vllm): engine sizes and switches "
        "only (engine.rollout.names.VLLM_ENGINE_KWARGS lists them), e.g. kv_cache_memory_bytes "
        "on a CPU.",
    )
    sglang: dict[str, Any] = _refused(
        {},
        "Extra keyword arguments of sglang.Engine (rollout.name=sglang).",
        "extra SGLang engine arguments are not passed through; set the mapped rollout keys",
    )
    trtllm: dict[str, Any] = _refused(
        {},
        "Extra keyword arguments of TensorRT-LLM (verl main's rollout.name=trtllm).",
        "TensorRT-LLM is not a rollout backend here; use rollout.name=vllm or hf",
    )


@dataclass
class CheckpointEngineConfig(_Section):
    """verl main's weight transfer from the trainer to the rollout engine."""

    _target_: str = _target("verl.workers.config.CheckpointEngineConfig")
    backend: str = _inert(
        "naive",
        "How verl moves the weights (naive, nccl, nixl, hccl); the sync here is the engine's own "
        "(in process, or buckets to a vLLM server).",
    )
    update_weights_bucket_megabytes: int = _f(
        2048,
        "vLLM: the weight sync sends the policy in buckets of this many MiB (verl main's key "
        "and default; 0.7 wrote rollout.update_weights_bucket_megabytes, default 512).",
        gt=0,
    )
    engine_kwargs: dict[str, Any] = _inert({}, "Further arguments of verl's checkpoint engine.")


@dataclass
class ValKwargsConfig(_Section):
    top_k: int = _f(-1, "Validation top-k; -1: off.")
    top_p: float = _f(1.0, "Validation nucleus sampling p.", gt=0, le=1)
    temperature: float = _f(0.0, "Validation temperature.", ge=0)
    n: int = _f(1, "Validation samples per prompt.", gt=0, le=MAX_BATCH)
    do_sample: bool = _f(False, "Sample in validation (False: greedy).")
    _target_: str = _target("verl.workers.config.SamplingConfig")


@dataclass
class MultiTurnConfig(_Section):
    enable: bool = _f(False, "Run multi-turn conversations.")
    max_assistant_turns: int | None = _f(None, "Most assistant turns; null: no limit.", gt=0)
    max_user_turns: int | None = _f(None, "Most user turns; null: no limit.", gt=0)
    interaction_path: str | None = _f(
        None, "Python file defining the interaction.", resource="code"
    )
    interaction_name: str | None = _f(
        None, "Function in interaction_path: (messages, extra_info) -> next message or None."
    )
    _target_: str = _target("verl.workers.config.MultiTurnConfig")
    tool_config_path: str | None = _f(
        None,
        "verl's tools YAML: class_name (a built-in tool, e.g. calculator, or module.Class of a "
        "tool the administrator installed; no other code is imported), "
        "config and the OpenAI function tool_schema. Hermes <tool_call> blocks in an assistant "
        "turn are run and answered as tool turns, masked out of the loss.",
        resource="path",
    )
    max_parallel_calls: int = _f(
        1, "Tool calls run per assistant turn (at once); further calls are dropped.", gt=0, le=64
    )
    max_tool_response_length: int = _f(
        256, "Longest tool answer in tokens; a longer one is cut.", gt=0, le=MAX_TOKENS
    )
    tool_response_truncate_side: str = _f(
        "middle",
        "Where a long tool answer is cut: left keeps its start, right its end, middle both.",
        choices=TRUNCATE_SIDES,
    )
    interaction_config_path: str | None = _f(
        None,
        "verl's interaction YAML: a list of {name, class_name, config}; class_name is imported "
        "(verl's BaseInteraction methods) and each sample talks to the one its "
        "extra_info.interaction_kwargs.name names. Instead of interaction_path.",
        resource="code",
    )
    use_inference_chat_template: bool = _f(
        False,
        "Build each later turn's prompt by rendering the messages with the chat template (as a "
        "chat server would) instead of continuing from the recorded token ids.",
    )
    tokenization_sanity_check_mode: str = _f(
        "strict",
        "After each rollout, warn when a conversation's turn-by-turn token ids differ from its "
        "messages tokenised in one piece: strict (any difference), ignore_strippable (more "
        "than whitespace), disable.",
        choices=SANITY_CHECK_MODES,
    )
    format: str = _f(
        "hermes",
        "Tool-call format: hermes (<tool_call>{name, arguments}</tool_call>).",
        choices=TOOL_CALL_FORMATS,
    )
    num_repeat_rollouts: int | None = _refused(
        None,
        "Repeat each interaction this many times.",
        "only verl's CollabLLM recipe reads it (its agent loop samples that many simulated "
        "continuations for its own reward manager); verl's multi-turn rollout ignores it and so "
        "does nothing here; leave it null",
    )


@dataclass
class RolloutConfig(_Section):
    name: str = _f("hf", "Generation backend.", choices=ROLLOUT_NAMES, basic=True)
    mode: str = _inert(
        "async",
        "Rollout mode (the engine generates each batch in one call).",
        choices=("sync", "async"),
    )
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
    gpu_memory_utilization: float = _f(
        DEFAULT_GPU_MEMORY_UTILIZATION,
        "vLLM: fraction of GPU memory it may use (on a CPU, keep 0.5 and size the KV cache with "
        "engine_kwargs.vllm.kv_cache_memory_bytes).",
        gt=0,
        le=1,
    )
    ignore_eos: bool = _f(False, "Keep generating after end-of-sequence.")
    enforce_eager: bool = _f(True, "vLLM: disable CUDA graphs.")
    free_cache_engine: bool = _f(True, "Free the KV cache while training.")
    enable_sleep_mode: bool = _f(
        True, "vLLM: sleep between rollouts to free GPU memory (no effect on a CPU)."
    )
    tensor_model_parallel_size: int = _f(1, "vLLM tensor parallel size.", gt=0, le=MAX_WORKERS)
    max_num_batched_tokens: int = _f(
        8192, "vLLM: tokens per scheduler step.", gt=0, le=MAX_TOKEN_BUDGET
    )
    max_model_len: int | None = _f(
        None, "vLLM context length; null: prompt + response.", gt=0, le=MAX_TOKEN_BUDGET
    )
    max_num_seqs: int = _f(
        256,
        "vLLM: sequences per scheduler step (verl main's default and vLLM's; verl 0.7: 1024).",
        gt=0,
        le=MAX_BATCH,
    )
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
    _target_: str = _target("verl.workers.config.RolloutConfig")
    cudagraph_capture_sizes: list[int] | None = _inert(None, "vLLM: CUDA graph batch sizes.")
    data_parallel_size: int = _refused(
        1, "Rollout data parallel size.", "one rollout engine per rank; keep 1"
    )
    expert_parallel_size: int = _refused(
        1, "Rollout expert parallel size.", "expert parallelism is not implemented; keep 1"
    )
    pipeline_model_parallel_size: int = _refused(
        1, "Rollout pipeline parallel size.", "pipeline parallelism is not implemented; keep 1"
    )
    enable_chunked_prefill: bool = _inert(True, "vLLM: chunked prefill.")
    enable_prefix_caching: bool = _inert(True, "vLLM: prefix caching.")
    logprobs_mode: str = _refused(
        "processed_logprobs",
        "Which log-probs the rollout returns.",
        "the rollout returns the log-probs of the distribution it sampled from "
        "(processed_logprobs); keep that",
    )
    load_format: str = _inert("dummy", "vLLM: how initial weights load (synced after).")
    log_prob_micro_batch_size: int | None = _global_micro_batch(
        "old-log-prob forward", "log_prob_micro_batch_size_per_gpu"
    )
    disable_log_stats: bool = _inert(True, "vLLM: statistics logging.")
    over_sample_rate: float = _inert(
        0,
        "End a rollout once (1 - rate) of its requests finished, the rest padded out of the "
        "loss. Only verl's SGLang SPMD rollout read it, retired before 0.7 (verl PR #4422): "
        "verl 0.7 and main accept it and change nothing, as here.",
        ge=0,
        lt=1,
    )
    multi_stage_wake_up: bool = _inert(False, "Wake weights and KV cache in stages.")
    engine_kwargs: EngineKwargsConfig = _section(EngineKwargsConfig, "Engine arguments.")
    update_weights_bucket_megabytes: int | None = _f(
        None,
        "verl 0.7's spelling of checkpoint_engine.update_weights_bucket_megabytes (deprecated, "
        "removed in verl main); null: that key.",
        gt=0,
    )
    checkpoint_engine: CheckpointEngineConfig = _section(
        CheckpointEngineConfig, "Weight sync from the trainer (verl main)."
    )
    scheduling_policy: str = _inert(
        "fcfs", "vLLM server: request scheduling (fcfs or priority); requests carry no priority."
    )
    mtp: MtpConfig = _section(
        MtpConfig, "Multi-token prediction in the rollout; verl main points it at model.mtp."
    )
    trace: TraceConfig = _section(TraceConfig, "Rollout tracing.")
    skip_rollout: bool = _refused(
        False,
        "Reuse rollouts dumped in skip_dump_dir.",
        "replaying dumped rollouts is not implemented; keep False",
    )
    skip_dump_dir: str = _inert(
        "/tmp/rollout_dump", "Folder of dumped rollouts (skip_rollout).", resource="server"
    )
    skip_tokenizer_init: bool = _inert(True, "vLLM: start without a tokenizer.")
    enable_rollout_routing_replay: bool = _refused(
        False, "Record MoE routing in the rollout.", "MoE router replay is not implemented"
    )
    prometheus: PrometheusConfig = _section(PrometheusConfig, "Prometheus metrics.")
    server: SGLangServerConfig = _section(
        SGLangServerConfig, "verl's SGLang server client (no server here: SGLang runs in process)."
    )
    sglang_rollout_mode: str | None = _refused(
        None,
        "verl's switch between SGLang's SPMD engine and its server (verl retired it in PR #4422; "
        "verl main stops on it too).",
        "SGLang here always runs its engine in this process, as verl's retired SPMD mode did; "
        "delete the key",
    )
    quantization: str | None = _refused(
        None,
        "Quantize the rollout's weights (e.g. fp8).",
        "a quantized rollout samples from another distribution than the policy trained, and "
        "rollout correction is not implemented yet; leave it null",
    )
    quantization_config_file: str | None = _refused(
        None, "Quantization settings file.", "rollout quantization is not implemented"
    )
    layered_summon: bool = _inert(False, "Gather FSDP weights layer by layer for the sync.")
    agent: AgentLoopConfig = _section(AgentLoopConfig, "verl's agent loops.")
    profiler: ProfilerConfig = _section(ProfilerConfig, "Profiling of the rollout.")


def rollout_problems(v: Validation) -> list[ConfigFieldError]:
    """Return the errors of the rollout's keys: a GPU engine on a CPU (or not installed), its
    parallel size, groups for a group estimator, top-k and temperature against sampling, and
    multi-turn's interaction and files; warn when a group's responses cannot differ."""
    cfg = v.cfg
    rollout: RolloutConfig = cfg.actor_rollout_ref.rollout
    algo = cfg.algorithm
    workers = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    errors = []
    for prefix, sampling in (
        ("actor_rollout_ref.rollout", rollout),
        ("actor_rollout_ref.rollout.val_kwargs", rollout.val_kwargs),
    ):
        if not (sampling.top_k == -1 or sampling.top_k > 0):
            errors.append(
                ConfigFieldError(f"{prefix}.top_k", sampling.top_k, "must be -1 (off) or > 0")
            )
    longest = cfg.data.max_response_length
    if rollout.response_length is not None and rollout.response_length > longest:
        errors.append(
            ConfigFieldError(
                "actor_rollout_ref.rollout.response_length",
                rollout.response_length,
                f"is longer than data.max_response_length={longest}, which sizes everything "
                "after generation (the actor's token budgets, the clip-ratio metric, overlong "
                f"penalties); set it at most {longest}, or raise data.max_response_length",
            )
        )
    estimator = algo.adv_estimator
    if estimator in GROUP_ESTIMATORS and rollout.n < 2 and not algo.allow_single_sample_groups:
        errors.append(
            ConfigFieldError(
                "actor_rollout_ref.rollout.n",
                rollout.n,
                f"{estimator} compares the responses to the same prompt, so it needs groups; "
                f"set actor_rollout_ref.rollout.n>=2 (e.g. 4), or "
                "algorithm.allow_single_sample_groups=True to run with single samples",
            )
        )
    if estimator in GROUP_ESTIMATORS and rollout.n > 1 and not rollout.do_sample:
        v.warnings.append(
            f"{estimator} with actor_rollout_ref.rollout.do_sample=False: every response in a "
            "group is the same, so every advantage is 0; set do_sample=True"
        )
    engine = {"vllm": "vLLM", "sglang": "SGLang"}.get(rollout.name)
    if rollout.name == "sglang" and cfg.trainer.device == "cpu":
        errors.append(
            ConfigFieldError(
                "actor_rollout_ref.rollout.name",
                rollout.name,
                f"{engine} needs a CUDA GPU; use actor_rollout_ref.rollout.name=hf or vllm",
            )
        )
    elif (
        engine
        and cfg.trainer.controller == "local"  # built here; a Ray actor raises it where it runs
        and importlib.util.find_spec(rollout.name) is None
    ):
        missing = SGLANG_MISSING if rollout.name == "sglang" else VLLM_MISSING
        errors.append(ConfigFieldError("actor_rollout_ref.rollout.name", rollout.name, missing))
    if rollout.name == "vllm":
        errors += _vllm_problems(rollout, cfg.trainer.device)
    if engine and rollout.tensor_model_parallel_size > workers:
        errors.append(
            ConfigFieldError(
                "actor_rollout_ref.rollout.tensor_model_parallel_size",
                rollout.tensor_model_parallel_size,
                f"exceeds the {workers} workers; lower it",
            )
        )
    elif rollout.name == "vllm" and workers % rollout.tensor_model_parallel_size:
        errors.append(
            ConfigFieldError(
                "actor_rollout_ref.rollout.tensor_model_parallel_size",
                rollout.tensor_model_parallel_size,
                f"must divide the {workers} workers (trainer.nnodes x trainer.n_gpus_per_node): "
                "each vLLM engine is that many consecutive ranks; use a divisor of "
                f"{workers}",
            )
        )
    multi_turn = rollout.multi_turn
    if multi_turn.interaction_config_path and (
        multi_turn.interaction_path or multi_turn.interaction_name
    ):
        errors.append(
            ConfigFieldError(
                "actor_rollout_ref.rollout.multi_turn.interaction_config_path",
                multi_turn.interaction_config_path,
                "and multi_turn.interaction_path / interaction_name both name an interaction; "
                "keep verl's YAML or the function",
            )
        )
    for prefix, sampling in (
        ("actor_rollout_ref.rollout", rollout),
        ("actor_rollout_ref.rollout.val_kwargs", rollout.val_kwargs),
    ):
        if sampling.do_sample and sampling.temperature <= 0:
            errors.append(
                ConfigFieldError(
                    f"{prefix}.temperature",
                    sampling.temperature,
                    f"must be > 0 when sampling; set {prefix}.do_sample=False for greedy decoding",
                )
            )
    if v.check_files and multi_turn.enable:
        for name, value, fix in (
            ("interaction_path", multi_turn.interaction_path, "point it at a Python file"),
            (
                "interaction_config_path",
                multi_turn.interaction_config_path,
                "point it at verl's interaction YAML",
            ),
            ("tool_config_path", multi_turn.tool_config_path, "point it at a tools YAML"),
        ):
            if value:
                key = f"actor_rollout_ref.rollout.multi_turn.{name}"
                errors += file_problems(v, key, value, fix)
    return errors


def _vllm_problems(rollout: RolloutConfig, device: str) -> list[ConfigFieldError]:
    """Check the keys only the ``vllm`` rollout reads: its context length and, on a CPU, ``gpu_memory_utilization`` (the adapter raises the
    same at start where ``trainer.device=auto`` resolves to a CPU)."""
    errors: list[ConfigFieldError] = []  # engine_kwargs.vllm: engine.config.mappings checks it
    longest = resolved(rollout.prompt_length, "actor_rollout_ref.rollout.prompt_length") + resolved(
        rollout.response_length, "actor_rollout_ref.rollout.response_length"
    )
    if rollout.max_model_len is not None and rollout.max_model_len < longest:
        errors.append(
            ConfigFieldError(
                "actor_rollout_ref.rollout.max_model_len",
                rollout.max_model_len,
                f"is shorter than prompt_length + response_length = {longest}, so vLLM would "
                f"cut responses short; set at least {longest}, or null for exactly that",
            )
        )
    default = DEFAULT_GPU_MEMORY_UTILIZATION
    if device == "cpu" and rollout.gpu_memory_utilization != default:
        errors.append(
            ConfigFieldError(
                "actor_rollout_ref.rollout.gpu_memory_utilization",
                rollout.gpu_memory_utilization,
                "sizes a GPU's KV cache, but trainer.device=cpu, where vLLM would take that "
                f"fraction of the machine's RAM; leave it at {default} and set "
                "actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes",
            )
        )
    return errors
