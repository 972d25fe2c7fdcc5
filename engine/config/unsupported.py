"""Sections of verl's config with no engine behind them: profilers, MoE router replay, agent
loops, tracing, Prometheus, a generative reward model's server, SandboxFusion, custom classes and
the TransferQueue.

They exist so a verl file or command line loads unchanged; each key is "no effect" (warned about
when set) or "refused" (an error naming what to do instead), see ``engine.config.fields``. The
sections that hold them import them from here.
"""

from dataclasses import dataclass
from typing import Any

from engine.config.fields import (
    MAX_BATCH,
    MAX_TOKEN_BUDGET,
    _f,
    _inert,
    _refused,
    _Section,
    _section,
    _target,
)


@dataclass
class NsysToolConfig(_Section):
    _target_: str = _target("verl.utils.profiler.config.NsightToolConfig")
    discrete: bool | None = _inert(
        None,
        "Nsight: one trace per task; null: global_profiler's.",
        follows="global_profiler.global_tool_config.nsys.discrete",
    )


@dataclass
class NPUToolConfig(_Section):
    _target_: str = _target("verl.utils.profiler.config.NPUToolConfig")
    contents: list[str] = _inert([], "Ascend NPU profiler contents.")
    level: str = _inert("level0", "Ascend NPU profiler level.")
    analysis: bool = _inert(True, "Ascend NPU profiler analysis.")
    discrete: bool = _inert(False, "Ascend NPU profiler: one trace per task.")


@dataclass
class TorchToolConfig(_Section):
    _target_: str = _target("verl.utils.profiler.config.TorchProfilerToolConfig")
    step_start: int = _inert(0, "torch profiler: first profiled step (verl 0.7).")
    step_end: int | None = _inert(None, "torch profiler: last profiled step (verl 0.7).")
    contents: list[str] = _inert([], "torch profiler: what to record (cpu, cuda, memory, ...).")
    discrete: bool = _inert(False, "torch profiler: one trace per task.")


@dataclass
class TorchMemoryToolConfig(_Section):
    _target_: str = _target("verl.utils.profiler.config.TorchMemoryToolConfig")
    trace_alloc_max_entries: int | None = _inert(
        None,
        "Memory snapshot: allocations kept; null: global_profiler's.",
        follows="global_profiler.global_tool_config.torch_memory.trace_alloc_max_entries",
    )
    stack_depth: int | None = _inert(
        None,
        "Memory snapshot: stack frames kept; null: global_profiler's.",
        follows="global_profiler.global_tool_config.torch_memory.stack_depth",
    )


@dataclass
class ProfilerToolConfig(_Section):
    nsys: NsysToolConfig = _section(NsysToolConfig, "Nsight Systems.")
    npu: NPUToolConfig = _section(NPUToolConfig, "Ascend NPU profiler.")
    torch: TorchToolConfig = _section(TorchToolConfig, "torch.profiler.")
    torch_memory: TorchMemoryToolConfig = _section(TorchMemoryToolConfig, "CUDA memory snapshots.")


@dataclass
class ProfilerConfig(_Section):
    _target_: str = _target("verl.utils.profiler.ProfilerConfig")
    tool: str | None = _inert(
        None, "Profiler of this role; null: global_profiler.tool.", follows="global_profiler.tool"
    )
    enable: bool = _inert(False, "Profile this role.")
    all_ranks: bool = _inert(False, "Profile every rank.")
    ranks: list[int] = _inert([], "Ranks to profile.")
    save_path: str | None = _inert(
        None,
        "Trace folder; null: global_profiler.save_path.",
        resource="server",
        follows="global_profiler.save_path",
    )
    tool_config: ProfilerToolConfig = _section(ProfilerToolConfig, "Per-tool settings.")


_NO_MTP = (
    "multi-token prediction (MTP) heads are neither loaded, trained nor used for speculative "
    "decoding here; keep False"
)


@dataclass
class MtpConfig(_Section):
    """verl main's multi-token prediction: extra heads trained beside the LM head and used as the
    rollout's speculative-decoding draft. Nothing here runs them."""

    _target_: str = _target("verl.workers.config.MtpConfig")
    enable: bool = _refused(False, "Load and save the model's MTP parameters.", _NO_MTP)
    enable_train: bool = _refused(False, "Train the MTP heads with the policy.", _NO_MTP)
    enable_rollout: bool = _refused(
        False, "Draft tokens with the MTP heads in the rollout.", _NO_MTP
    )
    detach_encoder: bool = _inert(False, "MTP training: detach the trunk from the MTP loss.")
    mtp_loss_scaling_factor: float = _refused(
        0.1, "MTP training: weight of the MTP loss.", "MTP training is not implemented"
    )
    speculative_algorithm: str = _inert("EAGLE", "SGLang speculative decoding algorithm.")
    speculative_num_steps: int = _inert(2, "SGLang speculative decoding: draft steps.")
    speculative_eagle_topk: int = _inert(2, "SGLang speculative decoding: EAGLE top-k.")
    speculative_num_draft_tokens: int = _inert(4, "SGLang speculative decoding: draft tokens.")
    method: str = _inert("mtp", "vLLM speculative decoding method.")
    num_speculative_tokens: int = _inert(1, "vLLM speculative decoding: draft tokens.")


@dataclass
class NsysGlobalConfig(_Section):
    _target_: str = _target("verl.utils.profiler.config.NsightToolConfig")
    discrete: bool = _inert(False, "Nsight: one trace per task.")
    controller_nsight_options: dict[str, Any] = _inert(
        {"trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": "true", "cuda-graph-trace": "graph"},
        "Nsight options of the controller process.",
    )
    worker_nsight_options: dict[str, Any] = _inert(
        {
            "trace": "cuda,nvtx,cublas,ucx",
            "cuda-memory-usage": "true",
            "cuda-graph-trace": "graph",
            "capture-range": "cudaProfilerApi",
            "capture-range-end": None,
            "kill": "none",
        },
        "Nsight options of the worker processes.",
    )


@dataclass
class TorchMemoryGlobalConfig(_Section):
    trace_alloc_max_entries: int = _inert(100000, "Memory snapshot: allocations kept.")
    stack_depth: int = _inert(32, "Memory snapshot: stack frames kept.")
    context: str = _inert("all", "Memory snapshot: context recorded.")
    stacks: str = _inert("all", "Memory snapshot: stacks recorded.")
    kw_args: dict[str, Any] = _inert({}, "Memory snapshot: further arguments.")


@dataclass
class GlobalToolConfig(_Section):
    nsys: NsysGlobalConfig = _section(NsysGlobalConfig, "Nsight Systems.")
    torch_memory: TorchMemoryGlobalConfig = _section(TorchMemoryGlobalConfig, "Memory snapshots.")


@dataclass
class GlobalProfilerConfig(_Section):
    _target_: str = _target("verl.utils.profiler.ProfilerConfig")
    tool: str | None = _inert(None, "Profiler: nsys, npu, torch or torch_memory.")
    steps: list[int] | None = _inert(None, "Steps to profile.")
    profile_continuous_steps: bool = _inert(False, "Profile the steps as one trace.")
    save_path: str = _inert("outputs/profile", "Trace folder.", resource="server")
    global_tool_config: GlobalToolConfig = _section(GlobalToolConfig, "Per-tool settings.")


@dataclass
class RouterReplayConfig(_Section):
    _target_: str = _target("verl.workers.config.RouterReplayConfig")
    mode: str = _refused(
        "disabled",
        "MoE router replay: disabled, R2 or R3.",
        "MoE router replay is not implemented; keep disabled",
    )
    record_file: str | None = _refused(
        None, "Where router decisions are recorded.", "MoE router replay is not implemented"
    )
    replay_file: str | None = _refused(
        None, "Router decisions to replay.", "MoE router replay is not implemented"
    )


@dataclass
class TiledMLPConfig(_Section):
    enabled: bool = _inert(False, "Compute the MLP in tiles to save memory.")
    num_shards: int = _inert(4, "Tiles of the tiled MLP.")


@dataclass
class FusedKernelOptions(_Section):
    impl_backend: str = _inert("torch", "Fused kernels' backend: torch or triton.")


@dataclass
class WrapPolicyConfig(_Section):
    min_num_params: int = _inert(0, "FSDP wraps modules of at least this many parameters.")


@dataclass
class CustomAsyncServerConfig(_Section):
    _target_: str = _target("verl.workers.config.CustomAsyncServerConfig")
    path: str | None = _refused(
        None,
        "Python file with a custom async rollout server.",
        "custom async rollout servers are not supported; use rollout.name=hf or vllm",
        resource="code",
    )
    name: str | None = _refused(
        None,
        "Class of the custom async rollout server.",
        "custom async rollout servers are not supported; use rollout.name=hf or vllm",
    )


_NO_AGENT_LOOP = (
    "verl's agent loops are not implemented; rollouts are single-turn, or multi-turn with "
    "rollout.multi_turn.interaction_path"
)


@dataclass
class AgentLoopConfig(_Section):
    _target_: str = _target("verl.workers.config.AgentLoopConfig")
    num_workers: int = _inert(8, "Agent loop worker processes.")
    default_agent_loop: str = _refused(
        "single_turn_agent", "Agent loop run for each prompt.", _NO_AGENT_LOOP
    )
    agent_loop_config_path: str | None = _refused(
        None, "YAML registering custom agent loops.", _NO_AGENT_LOOP, resource="code"
    )
    custom_async_server: CustomAsyncServerConfig = _section(
        CustomAsyncServerConfig, "A custom rollout server."
    )


@dataclass
class TraceConfig(_Section):
    _target_: str = _target("verl.workers.config.TraceConfig")
    backend: str | None = _inert(None, "Rollout tracing backend: weave or mlflow.")
    token2text: bool = _inert(False, "Decode token ids in traces.")
    max_samples_per_step_per_worker: int | None = _inert(None, "Traces kept per step and worker.")


@dataclass
class PrometheusConfig(_Section):
    _target_: str = _target("verl.workers.config.PrometheusConfig")
    enable: bool = _inert(False, "Export rollout server metrics to Prometheus.")
    port: int = _inert(9090, "Prometheus port.", resource="server")
    file: str = _inert(
        "/tmp/ray/session_latest/metrics/prometheus/prometheus.yml",
        "Prometheus configuration file.",
        resource="server",
    )
    served_model_name: str | None = _inert(
        None,
        "Model name in the exported metrics; null: the model path.",
        follows="actor_rollout_ref.model.path",
    )


@dataclass
class SGLangServerConfig(_Section):
    """verl main's ``rollout.server`` (a field of its RolloutConfig, not of its generated YAML):
    the HTTP client of verl's SGLang server. The ``sglang`` rollout here drives SGLang's engine
    in its own process, with no server to wait for or retry."""

    timeout: float = _inert(60.0, "SGLang server: seconds a request may take.")
    max_attempts: int = _inert(3, "SGLang server: tries per request.")
    retry_delay: float = _inert(2.0, "SGLang server: seconds between tries.")
    max_connections: int = _inert(1000, "SGLang server: open connections at most.")
    max_start_wait_time: float = _inert(300.0, "SGLang server: seconds to wait for it to start.")


@dataclass
class RewardModelRolloutConfig(_Section):
    _target_: str = _target("verl.workers.config.RolloutConfig")
    name: str | None = _f(
        None,
        "Backend that serves a generative judge (reward_model.judge.prompt_template): hf (the "
        "engine's own sampler, CPU or GPU) or vllm (where installed; its engine settings are "
        "actor_rollout_ref.rollout's, engine_kwargs.vllm and max_model_len included); null: hf. "
        "Not read for a sequence-classifier reward model, which scores with transformers.",
    )
    dtype: str = _inert("bfloat16", "Reward model server dtype.")
    gpu_memory_utilization: float = _inert(0.5, "Reward model server GPU memory fraction.")
    enforce_eager: bool = _inert(True, "Reward model server: disable CUDA graphs.")
    cudagraph_capture_sizes: list[int] | None = _inert(None, "CUDA graph batch sizes.")
    free_cache_engine: bool = _inert(True, "Free the reward server's KV cache between uses.")
    data_parallel_size: int = _inert(1, "Reward model server data parallel size.")
    expert_parallel_size: int = _inert(1, "Reward model server expert parallel size.")
    tensor_model_parallel_size: int = _inert(2, "Reward model server tensor parallel size.")
    max_num_batched_tokens: int = _inert(8192, "Reward model server tokens per step.")
    max_model_len: int | None = _inert(None, "Reward model server context length.")
    max_num_seqs: int = _f(
        1024,
        "Reward model server sequences per step; with use_reward_loop and no "
        "micro_batch_size_per_gpu, the samples per reward-model forward here, and a judge's "
        "prompts generated at once (its requests in flight, verl's max_concurrent).",
        gt=0,
        le=MAX_BATCH,
    )
    load_format: str = _inert("auto", "Reward model server weight loading.")
    engine_kwargs: dict[str, Any] = _inert({}, "Reward model server engine arguments.")
    limit_images: int | None = _inert(None, "Reward model server images per prompt.")
    enable_chunked_prefill: bool = _inert(True, "Reward model server chunked prefill.")
    enable_prefix_caching: bool = _inert(True, "Reward model server prefix caching.")
    disable_log_stats: bool = _inert(True, "Reward model server statistics logging.")
    skip_tokenizer_init: bool = _inert(False, "Reward model server without a tokenizer.")
    prompt_length: int = _f(
        2048,
        "Longest judge prompt in the judge's tokens (reward_model.judge); a longer one is that "
        "sample's reward error, not cut.",
        gt=0,
        le=MAX_TOKEN_BUDGET,
    )
    response_length: int = _f(
        2048,
        "Most tokens of a judge's reply (reward_model.judge); it stops earlier at its EOS.",
        gt=0,
        le=MAX_TOKEN_BUDGET,
    )


@dataclass
class ModuleConfig(_Section):
    _target_: str = _target("verl.trainer.config.config.ModuleConfig")
    path: str | None = _refused(
        None,
        "Python file with a custom reward manager.",
        "custom reward managers are not loaded; use reward_manager=batch with a "
        "custom_reward_function, or a reward module in POSTTRAIN_REWARD_MODULES_DIR "
        "(docs/security.md)",
        resource="code",
    )
    name: str = _refused(
        "custom_reward_manager",
        "Class of the custom reward manager.",
        "custom reward managers are not loaded; write a custom_reward_function",
    )


@dataclass
class ClassFileConfig(_Section):
    path: str | None = _refused(
        None,
        "Python file with the class.",
        "data generator classes are not loaded; bring the data as parquet, JSONL or CSV (or a "
        "dataset class, data.custom_cls)",
        resource="code",
    )
    name: str | None = _refused(
        None,
        "Class name in that file.",
        "data generator classes are not loaded; bring the data as parquet, JSONL or CSV (or a "
        "dataset class, data.custom_cls)",
    )


@dataclass
class TransferQueueConfig(_Section):
    enable: bool = _refused(
        False,
        "Move batches through verl's TransferQueue.",
        "the TransferQueue is not implemented; batches move through the controller",
    )
