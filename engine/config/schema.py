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
    BYPASS_LOSS_TYPES,
    GROUP_ESTIMATORS,  # noqa: F401
    KL_CONTROLLER_TYPES,
    KL_ESTIMATORS,  # noqa: F401
    KL_TYPES,
    LOSS_AGG_MODES,
    PF_PPO_REWEIGHT_METHODS,
    POLICY_LOSS_MODES,
    ROLLOUT_IS_LEVELS,
    ROLLOUT_RS_LEVELS,
)
from engine.config.trackers import TRACKERS
from engine.rewards.names import REWARD_COMPONENTS, REWARD_FN_NAMES, REWARD_MANAGERS  # noqa: F401
from engine.rollout import ROLLOUT_NAMES, SANITY_CHECK_MODES
from engine.rollout.tool_calls import TOOL_CALL_FORMATS, TRUNCATE_SIDES

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
# What a key does here, each key exactly one (docs/config.md lists them in three tables):
#   honoured   it changes what the engine does
#   no effect  a speed or infrastructure knob of an engine this one does not run; setting it
#              prints one warning line naming every such key that was set
#   refused    a feature this engine does not have; any value but the default is an error that
#              says what to do instead (``why``)
HONOURED, NO_EFFECT, REFUSED = "honoured", "no effect", "refused"
EFFECTS = (HONOURED, NO_EFFECT, REFUSED)
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
        self.config: Any = None  # the config without the bad values, where a loader built one
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
    effect: str = HONOURED,
    why: str | None = None,
    follows: str | None = None,
) -> Any:
    """Return a field with help text; mutable defaults are copied per instance.

    ``gt``, ``ge``, ``lt`` and ``le`` bound a number (``> gt``, ``>= ge``, ...; None passes):
    the validator checks them and the form gives its input ``min`` and ``max``. ``resource``
    says what a string names (one of ``RESOURCES``: path, code, module, server). ``effect`` is
    one of ``EFFECTS``; a refused key says ``why`` (what is missing, what to do instead).
    ``follows`` names the key a derived key copies in verl (``actor.rollout_n`` follows
    ``rollout.n``): null takes that value, and any other value must equal it.
    """
    if resource is not None and resource not in RESOURCES:
        raise ValueError(f"resource={resource!r}: must be one of {', '.join(RESOURCES)}")
    if effect not in EFFECTS:
        raise ValueError(f"effect={effect!r}: must be one of {', '.join(EFFECTS)}")
    if (effect == REFUSED) != bool(why):
        raise ValueError("a refused key says why (and only a refused key has a why)")
    metadata = {
        "help": help,
        "choices": choices,
        "basic": basic,
        "gt": gt,
        "ge": ge,
        "lt": lt,
        "le": le,
        "resource": resource,
        "effect": effect,
        "why": why,
        "follows": follows,
    }
    if isinstance(default, list | dict):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def _inert(default: Any, help: str, **kwargs: Any) -> Any:
    """Return a no-effect field: accepted so verl's files load, warned about when set."""
    return _f(default, help, effect=NO_EFFECT, **kwargs)


def _refused(default: Any, help: str, why: str, **kwargs: Any) -> Any:
    """Return a refused field: only its default is accepted; ``why`` says what to do instead."""
    return _f(default, help, effect=REFUSED, why=why, **kwargs)


def _target(class_path: str) -> Any:
    """Return verl's ``_target_`` of a section: the class verl builds from it, kept as is."""
    return _refused(
        class_path,
        "verl's config class for this section.",
        "the engine builds its own config objects and loads no class named here; keep verl's "
        "value or leave the key out",
    )


def _rollout_n() -> Any:
    """Return verl's ``rollout_n`` of a role: derived from ``rollout.n``, never set on its own."""
    return _refused(
        None,
        "Responses per prompt; null: rollout.n.",
        "it is derived from actor_rollout_ref.rollout.n; set that",
        follows="actor_rollout_ref.rollout.n",
    )


def _ulysses() -> Any:
    """Return a role's ``ulysses_sequence_parallel_size``: only 1 (no sequence parallelism)."""
    return _refused(1, "Ulysses sequence parallel size.", _NO_ULYSSES)


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


# ---------------------------------------------------------------- verl sections with no engine
# Sections of verl's config that name machinery this engine does not run (profilers, MoE router
# replay, agent loops, Prometheus, ...). They exist so a verl file or command line loads
# unchanged; each key is "no effect" or "refused" (see EFFECTS).

_MULTIMODAL = "multimodal data is not supported; use a text-only dataset"
_NO_ULYSSES = (
    "Ulysses sequence parallelism is not implemented; keep 1 and lower the sequence length or "
    "raise the number of ranks"
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
    step_start: int = _inert(0, "torch profiler: first profiled step.")
    step_end: int | None = _inert(None, "torch profiler: last profiled step.")


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
class EngineKwargsConfig(_Section):
    vllm: dict[str, Any] = _f(
        {},
        "Extra keyword arguments of vllm.LLM (rollout.name=vllm): engine sizes and switches "
        "only (engine.rollout.vllm_args lists them), e.g. kv_cache_memory_bytes on a CPU.",
    )
    sglang: dict[str, Any] = _refused(
        {},
        "Extra keyword arguments of sglang.Engine (rollout.name=sglang).",
        "extra SGLang engine arguments are not passed through; set the mapped rollout keys",
    )


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
class RewardModelRolloutConfig(_Section):
    _target_: str = _target("verl.workers.config.RolloutConfig")
    name: str | None = _inert(None, "Generative reward model server (verl's reward loop).")
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
    max_num_seqs: int = _inert(1024, "Reward model server sequences per step.")
    load_format: str = _inert("auto", "Reward model server weight loading.")
    engine_kwargs: dict[str, Any] = _inert({}, "Reward model server engine arguments.")
    limit_images: int | None = _inert(None, "Reward model server images per prompt.")
    enable_chunked_prefill: bool = _inert(True, "Reward model server chunked prefill.")
    enable_prefix_caching: bool = _inert(True, "Reward model server prefix caching.")
    disable_log_stats: bool = _inert(True, "Reward model server statistics logging.")
    skip_tokenizer_init: bool = _inert(False, "Reward model server without a tokenizer.")
    prompt_length: int = _inert(2048, "Reward model server prompt length.")
    response_length: int = _inert(2048, "Reward model server response length.")


@dataclass
class SandboxFusionConfig(_Section):
    url: str | None = _refused(
        None,
        "A SandboxFusion server that runs code rewards.",
        "code rewards run in the engine's own sandbox (docs/security.md); leave the url unset",
        resource="server",
    )
    max_concurrent: int = _inert(64, "SandboxFusion: concurrent requests.")
    memory_limit_mb: int = _inert(1024, "SandboxFusion: memory per program.")


@dataclass
class RolloutCorrectionConfig(_Section):
    """verl's rollout correction between the trainer's and the rollout's log-probs
    (``engine.algorithms.rollout_correction``; docs/validation-and-checkpoints.md)."""

    rollout_is: str | None = _f(
        None,
        "Truncated importance-sampling weights pi_old / pi_rollout on the policy loss: token "
        "(per token) or sequence (product over the response); null: none. Makes the trainer "
        "recompute the old log-probs unless bypass_mode.",
        choices=ROLLOUT_IS_LEVELS,
    )
    rollout_is_threshold: float = _f(
        2.0,
        "Upper truncation of the IS weights (typical 1.5-5 per token, 2-10 per sequence).",
        gt=0,
    )
    rollout_rs: str | None = _f(
        None,
        "Rejection sampling: mask out tokens (token), responses (sequence: product of ratios) or "
        "responses by the geometric mean of their ratios (geometric) outside "
        "[rollout_rs_threshold_lower, rollout_rs_threshold]; null: none.",
        choices=ROLLOUT_RS_LEVELS,
    )
    rollout_rs_threshold: float | None = _f(
        None, "Upper ratio of rejection sampling; required when rollout_rs is set.", gt=0
    )
    rollout_rs_threshold_lower: float | None = _f(
        None, "Lower ratio of rejection sampling; null: 1 / rollout_rs_threshold.", gt=0
    )
    rollout_token_veto_threshold: float | None = _f(
        None,
        "Mask out a whole response holding a token whose ratio is under this (e.g. 1e-4); "
        "null: off.",
        gt=0,
    )
    bypass_mode: bool = _f(
        False,
        "Use the rollout's log-probs as the old policy's and skip the old-log-prob forward pass; "
        "the corrections then compare the current policy with the rollout's, inside the loss.",
    )
    loss_type: str = _f(
        "ppo_clip",
        "Loss of bypass mode: ppo_clip (PPO's clipped ratio to the rollout policy, no IS "
        "weights) or reinforce (REINFORCE times the IS weights).",
        choices=BYPASS_LOSS_TYPES,
    )
    rollout_is_batch_normalize: bool = _f(
        False, "Divide the truncated IS weights by their batch mean (mean 1)."
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


@dataclass
class ClassFileConfig(_Section):
    path: str | None = _refused(
        None,
        "Python file with the class.",
        "custom dataset and data generator classes are not loaded; bring the data as parquet, "
        "JSONL or CSV and map its columns with data.data_key_map",
        resource="code",
    )
    name: str | None = _refused(
        None,
        "Class name in that file.",
        "custom dataset and data generator classes are not loaded; map columns with "
        "data.data_key_map",
    )


@dataclass
class SamplerConfig(_Section):
    class_path: str | None = _refused(
        None,
        "Python file with a curriculum sampler.",
        "custom samplers are not loaded; the data is shuffled by data.shuffle and data.seed",
        resource="code",
    )
    class_name: str | None = _refused(
        None,
        "Class of the curriculum sampler.",
        "custom samplers are not loaded; the data is shuffled by data.shuffle and data.seed",
    )


@dataclass
class TransferQueueConfig(_Section):
    enable: bool = _refused(
        False,
        "Move batches through verl's TransferQueue.",
        "the TransferQueue is not implemented; batches move through the controller",
    )


@dataclass
class RayKwargsInitConfig(_Section):
    num_cpus: int | None = _f(
        None, "CPUs Ray may use; null: all (same as ray_init.num_cpus).", gt=0, resource="server"
    )


@dataclass
class RayKwargsConfig(_Section):
    ray_init: RayKwargsInitConfig = _section(RayKwargsInitConfig, "ray.init arguments.")
    timeline_json_file: str | None = _inert(
        None, "Write Ray's task timeline here.", resource="server"
    )


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
    gen_batch_size: int | None = _f(
        None,
        "Prompts per generation batch with algorithm.filter_groups (DAPO); null: train_batch_size.",
        gt=0,
        le=MAX_BATCH,
    )
    return_raw_input_ids: bool = _inert(False, "Also return unpadded prompt ids.")
    return_raw_chat: bool = _f(False, "Also return the prompt as chat messages.")
    return_full_prompt: bool = _inert(
        False, "Also return the prompt with the chat template applied."
    )
    shuffle: bool = _f(True, "Shuffle the training data each epoch.")
    validation_shuffle: bool = _inert(
        False, "Shuffle the validation data (validation scores every row either way)."
    )
    seed: int | None = _f(1, "Seed of the training data shuffle; null: trainer.seed.")
    dataloader_num_workers: int = _inert(
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
    use_shm: bool = _inert(False, "Copy the data through shared memory first.")
    train_max_samples: int = _f(
        -1,
        "Use only N training rows: the first N, or with shuffle N drawn with seed (as verl); "
        "-1: all (N over the row count: all).",
        ge=-1,
        le=MAX_BATCH * 1024,
    )
    val_max_samples: int = _f(
        -1,
        "Use only N validation rows: the first N, or with shuffle N drawn with seed (as verl); "
        "-1: all (N over the row count: all).",
        ge=-1,
        le=MAX_BATCH * 1024,
    )
    tool_config_path: str | None = _f(
        None,
        "Tools YAML of the dataset; null: rollout.multi_turn.tool_config_path.",
        resource="path",
        follows="actor_rollout_ref.rollout.multi_turn.tool_config_path",
    )
    image_patch_size: int = _inert(14, "Vision patch size of multimodal data.")
    filter_overlong_prompts_workers: int = _inert(1, "Processes filtering overlong prompts.")
    image_key: str = _refused("images", "Column holding a row's images.", _MULTIMODAL)
    video_key: str = _refused("videos", "Column holding a row's videos.", _MULTIMODAL)
    custom_cls: ClassFileConfig = _section(ClassFileConfig, "A custom dataset class.")
    return_multi_modal_inputs: bool = _inert(True, "Return multimodal inputs with each row.")
    sampler: SamplerConfig = _section(SamplerConfig, "A custom (curriculum) sampler.")
    datagen: ClassFileConfig = _section(ClassFileConfig, "A dynamic data generator.")
    apply_chat_template_kwargs: dict[str, Any] = _f(
        {},
        "Keyword arguments of the chat template, for prompts and multi-turn turns "
        "(e.g. {enable_thinking: false}).",
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
        None,
        "Python module imported before the policy loads, so a custom model registers.",
        resource="module",
    )
    override_config: dict[str, Any] = _f({}, "Overrides of the model's config.json values.")
    trust_remote_code: bool = _f(False, "Allow custom model code from the model folder.")
    enable_gradient_checkpointing: bool = _f(True, "Recompute activations to save memory.")
    use_remove_padding: bool = _f(
        False,
        "Padding-free forward: each micro-batch's real tokens packed into one row, position ids "
        "restarting per sequence, attention kept inside each sequence (flash-attn varlen on a GPU "
        "when installed); for the policy's log-prob and update passes and the reference. Pays "
        "most with use_dynamic_bsz on responses of varied length.",
    )
    lora_rank: int = _f(0, "LoRA rank; 0 trains all weights.", ge=0)
    lora_alpha: int = _f(16, "LoRA scaling alpha.")
    target_modules: str | list[str] = _f("all-linear", "Modules LoRA adapts.")
    exclude_modules: str | list[str] | None = _f(
        None,
        "Modules LoRA leaves alone: a regex over full module names, or a list of names.",
    )
    lora_adapter_path: str | None = _refused(
        None,
        "A trained LoRA adapter to start from.",
        "starting from a saved adapter is not supported; merge it into the model first "
        "(python -m engine.model_merger) and point model.path at the result",
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
    _target_: str = _target("verl.workers.config.PolicyLossConfig")


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
    ulysses_sequence_parallel_size: int = _ulysses()
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
    _target_: str = _target("verl.workers.config.FSDPActorConfig")
    rollout_n: int | None = _rollout_n()
    ppo_micro_batch_size: int | None = _f(
        None,
        "Samples per forward pass over all GPUs (verl's deprecated global size): divided by the "
        "data-parallel size into ppo_micro_batch_size_per_gpu.",
        gt=0,
        le=MAX_BATCH,
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
    ulysses_sequence_parallel_size: int = _ulysses()
    entropy_from_logits_with_chunking: bool = _inert(False, "Compute entropy in chunks.")
    entropy_checkpointing: bool = _inert(False, "Recompute entropy in backward.")
    use_remove_padding: bool | None = _f(
        None,
        "Padding-free forward; null: model.use_remove_padding (any other value must equal it).",
        follows="actor_rollout_ref.model.use_remove_padding",
    )
    profiler: ProfilerConfig = _section(ProfilerConfig, "Profiling of the actor.")


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
    log_prob_micro_batch_size: int | None = _f(
        None,
        "Samples per reference forward over all GPUs (verl's deprecated global size): divided "
        "by the data-parallel size into log_prob_micro_batch_size_per_gpu.",
        gt=0,
        le=MAX_BATCH,
    )
    router_replay: RouterReplayConfig = _section(RouterReplayConfig, "MoE router replay.")
    _target_: str = _target("verl.workers.config.FSDPActorConfig")
    ulysses_sequence_parallel_size: int = _ulysses()
    entropy_from_logits_with_chunking: bool = _inert(False, "Compute entropy in chunks.")
    entropy_checkpointing: bool = _inert(False, "Recompute entropy in backward.")
    profiler: ProfilerConfig = _section(ProfilerConfig, "Profiling of the reference.")


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
        "verl's tools YAML: class_name (a built-in tool, e.g. calculator; nothing is imported), "
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
        0.5,
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
    log_prob_micro_batch_size: int | None = _f(
        None,
        "Samples per old-log-prob forward over all GPUs (verl's deprecated global size): "
        "divided by the data-parallel size into log_prob_micro_batch_size_per_gpu.",
        gt=0,
        le=MAX_BATCH,
    )
    disable_log_stats: bool = _inert(True, "vLLM: statistics logging.")
    over_sample_rate: float = _refused(
        0, "Start more prompts than needed and drop the slowest.", "not implemented; keep 0"
    )
    multi_stage_wake_up: bool = _inert(False, "Wake weights and KV cache in stages.")
    engine_kwargs: EngineKwargsConfig = _section(EngineKwargsConfig, "Engine arguments.")
    update_weights_bucket_megabytes: int = _f(
        512, "vLLM: the weight sync sends the policy in buckets of this many MiB.", gt=0
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


@dataclass
class ActorRolloutRefConfig(_Section):
    hybrid_engine: bool = _refused(
        True,
        "Actor, rollout and reference share devices.",
        "the rollout always runs on the actor's devices; keep True",
    )
    nccl_timeout: int = _inert(600, "Seconds before a stuck NCCL collective fails.")
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
    checkpoint: CheckpointConfig = _section(CheckpointConfig, "Critic checkpoint contents.")
    _target_: str = _target("verl.workers.config.FSDPCriticConfig")
    rollout_n: int | None = _rollout_n()
    ppo_micro_batch_size: int | None = _f(
        None,
        "Samples per forward over all GPUs (verl's deprecated global size): divided by the "
        "data-parallel size into ppo_micro_batch_size_per_gpu.",
        gt=0,
        le=MAX_BATCH,
    )
    forward_max_token_len_per_gpu: int | None = _f(
        None,
        "Token budget per values micro-batch (use_dynamic_bsz); null: ppo_max_token_len_per_gpu.",
        gt=0,
        le=MAX_TOKEN_BUDGET,
    )
    data_loader_seed: int = _f(42, "Seed of the mini-batch shuffle between PPO epochs.")
    forward_micro_batch_size: int | None = _f(
        None,
        "Samples per values forward over all GPUs (verl's deprecated global size): divided by "
        "the data-parallel size into forward_micro_batch_size_per_gpu.",
        gt=0,
        le=MAX_BATCH,
    )
    forward_micro_batch_size_per_gpu: int | None = _f(
        None,
        "Samples per values forward per GPU; null: ppo_micro_batch_size_per_gpu.",
        gt=0,
        le=MAX_BATCH,
    )
    ulysses_sequence_parallel_size: int = _ulysses()
    profiler: ProfilerConfig = _section(ProfilerConfig, "Profiling of the critic.")


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
class KLControlConfig(_Section):
    type: str = _f("fixed", "KL coefficient controller.", choices=KL_CONTROLLER_TYPES)
    kl_coef: float = _f(0.001, "(Initial) coefficient of KL in the reward.", basic=True, ge=0)
    horizon: int = _f(10000, "adaptive: steps over which the coefficient adapts.", le=MAX_STEPS)
    target_kl: float = _f(0.1, "adaptive/pid: KL the controller aims for.")
    kp: float = _f(0.1, "pid: proportional gain on (kl - target_kl).")
    ki: float = _f(0.01, "pid: integral gain.")
    kd: float = _f(0.0, "pid: derivative gain.")
    _target_: str = _target("verl.trainer.config.KLControlConfig")


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
class FilterGroupsConfig(_Section):
    _target_: str = _target("verl.trainer.config.FilterGroupsConfig")
    enable: bool = _f(
        False,
        "DAPO's dynamic sampling: drop each prompt's group whose metric is the same for every "
        "response (zero advantage), generate more batches of data.gen_batch_size prompts until "
        "data.train_batch_size groups are kept, and train on exactly that many.",
    )
    metric: str | None = _f(
        None,
        "What a kept group must vary in: acc, score (the reward function's score), seq_reward "
        "(the reward summed over tokens, overlong penalty included), seq_final_reward (after the "
        "KL in the reward), or another key the reward function returns.",
    )
    max_num_gen_batches: int = _f(
        0,
        "Generation batches one step may use before it fails; <= 0: no limit.",
        le=MAX_STEPS,
    )


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
    rollout_correction: RolloutCorrectionConfig = _section(
        RolloutCorrectionConfig, "Correction for the rollout's own probabilities."
    )
    filter_groups: FilterGroupsConfig = _section(
        FilterGroupsConfig, "DAPO's dynamic sampling (group filtering)."
    )
    _target_: str = _target("verl.trainer.config.AlgoConfig")


@dataclass
class TrainerConfig(_Section):
    total_epochs: int = _f(30, "Passes over the training data.", basic=True, gt=0, le=MAX_EPOCHS)
    total_training_steps: int | None = _f(
        None, "Stop after this many steps.", basic=True, gt=0, le=MAX_STEPS
    )
    project_name: str = _f("posttrain", "Project the run belongs to.", basic=True)
    experiment_name: str = _f("default", "Name of the run.", basic=True)
    logger: list[str] = _f(["console"], "Metric sinks and trackers.", choices=TRACKERS)
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
        None,
        "Newest steps whose actor/ state is kept; a step left with no state is deleted; null: all.",
        gt=0,
        le=MAX_STEPS,
    )
    max_critic_ckpt_to_keep: int | None = _f(
        None,
        "Newest steps whose critic/ state is kept; a step left with no state is deleted; "
        "null: all.",
        gt=0,
        le=MAX_STEPS,
    )
    seed: int = _f(1, "Seed of sampling and initialisation.")
    rollout_data_dir: str | None = _refused(
        None,
        "Dump each step's rollouts as JSON lines here.",
        "set trainer.logger to include jsonl (samples.jsonl in the run's folder) instead",
        resource="server",
    )
    validation_data_dir: str | None = _refused(
        None,
        "Dump each validation's generations as JSON lines here.",
        "set trainer.logger to include jsonl (samples.jsonl in the run's folder) instead",
        resource="server",
    )
    esi_redundant_time: int = _inert(0, "Elastic instance: spare seconds before expiry.")
    default_hdfs_dir: str | None = _refused(
        None,
        "Copy checkpoints to HDFS.",
        "checkpoints stay in trainer.default_local_dir",
        resource="server",
    )
    del_local_ckpt_after_load: bool = _refused(
        False,
        "Delete the local checkpoint after resuming from it.",
        "a checkpoint is never deleted on resume; prune with max_actor_ckpt_to_keep",
    )
    ray_wait_register_center_timeout: int = _inert(300, "Seconds to wait for Ray workers.")
    use_legacy_worker_impl: str = _inert("auto", "verl's worker implementation.")


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
    ray_kwargs: RayKwargsConfig = _section(RayKwargsConfig, "Ray start-up (verl 0.7's place).")
    reward_manager: RewardManagerConfig = _section(RewardManagerConfig, "The reward manager.")
    global_profiler: GlobalProfilerConfig = _section(GlobalProfilerConfig, "Profiling.")
    transfer_queue: TransferQueueConfig = _section(TransferQueueConfig, "verl's TransferQueue.")
    extras: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "Keys added with +key=value that PostTrain does not know.",
            "extras": True,
        },
    )
