"""What the ``vllm`` rollout passes to vLLM's engine, worked out and checked without torch.

``actor_rollout_ref.rollout.engine_kwargs.vllm`` adds keyword arguments to ``vllm.LLM`` on top of
those mapped from the rollout keys. It is limited to engine tuning that cannot name a file, a
folder, a server or code: vLLM also accepts ``model``, ``download_dir``, ``worker_extension_cls``,
``logits_processors`` and the like, and a config typed into the studio must not reach any of them.
The keys mapped from the rollout config are refused there too, naming the rollout key to set, so
one value is never set in two places. The config validator and the adapters both call
``engine.config.mappings.vllm_engine_kwargs_problems`` (over the lists in ``engine.rollout.names``),
so the CLI, the studio and a direct ``VLLMRollout`` agree.

:func:`engine_arguments` maps a rollout config to the engine's arguments, the same for the
colocated engine (``vllm_rollout``) and the server (``vllm_server``); :func:`import_vllm` imports
vLLM and names a model folder it cannot load before an engine starts.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from engine.config.mappings import vllm_engine_kwargs_problems
from engine.rollout.names import DEFAULT_GPU_MEMORY_UTILIZATION, VLLM_MISSING

if TYPE_CHECKING:
    from engine.config import RolloutConfig

# The KV cache of a CPU engine unless engine_kwargs.vllm.kv_cache_memory_bytes says otherwise.
CPU_KV_CACHE_BYTES = 1024**3


def supported_architectures_problem(model_path: str, supported: Iterable[str]) -> str | None:
    """Return why vLLM cannot load the model folder ``model_path``, or None if it can.

    Reads ``config.json``'s ``architectures`` and compares them with vLLM's ``ModelRegistry``.
    """
    config = Path(model_path) / "config.json"
    if not config.is_file():
        return f"{model_path} has no config.json; vLLM loads a Hugging Face model folder"
    architectures = json.loads(config.read_text()).get("architectures") or []
    known = set(supported)
    if architectures and not any(name in known for name in architectures):
        return (
            f"vLLM cannot load {model_path}: its architecture {', '.join(architectures)} is not "
            "one vLLM supports"
        )
    return None


def engine_arguments(
    model_path: str,
    cfg: RolloutConfig,
    *,
    on_cpu: bool,
    sleep_mode: bool,
    max_model_len: int | None = None,
    seed: int = 0,
    model_overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Return vLLM's engine arguments (``vllm.LLM``, ``AsyncEngineArgs``) for a rollout config.

    ``model_overrides`` (the config attributes the policy's ``model.override_config`` changed,
    :func:`~engine.roles.model_loading.changed_config_attributes`) reach vLLM as
    ``hf_overrides``, so the engine builds the model the policy trains (with a changed
    ``rope_theta`` it would otherwise sample from another model than the one being trained).

    Mapped from the rollout keys, then the config's ``engine_kwargs.vllm`` on top. The context
    length is ``max_model_len``, else the config's, else ``prompt_length + response_length``;
    a shorter one than that sum is refused. Raise ValueError for an ``engine_kwargs.vllm`` key that is not passed on, and on a CPU for a
    ``gpu_memory_utilization`` other than the default (the KV cache is sized in bytes there).
    """
    configured = dict(getattr(getattr(cfg, "engine_kwargs", None), "vllm", None) or {})
    problems = vllm_engine_kwargs_problems(configured)
    if problems:
        raise ValueError("; ".join(str(problem) for problem in problems))
    kwargs: dict[str, Any] = {
        "model": model_path,
        "tensor_parallel_size": cfg.tensor_model_parallel_size,
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "max_num_batched_tokens": cfg.max_num_batched_tokens,
        "max_num_seqs": cfg.max_num_seqs,
        "enable_sleep_mode": sleep_mode,
        "dtype": cfg.dtype,
        "enforce_eager": cfg.enforce_eager,
        "skip_tokenizer_init": False,
        "seed": seed,
        "logprobs_mode": "processed_logprobs",
        # A weight update makes cached prefixes stale; the cache is reset after each load.
        "enable_prefix_caching": True,
    }
    if model_overrides:
        kwargs["hf_overrides"] = dict(model_overrides)
    lengths = (getattr(cfg, "prompt_length", None), getattr(cfg, "response_length", None))
    needed = None if None in lengths else sum(cast(tuple[int, int], lengths))
    longest = max_model_len or getattr(cfg, "max_model_len", None) or needed
    if longest and needed and longest < needed:
        raise ValueError(
            f"actor_rollout_ref.rollout.max_model_len={longest} is shorter than prompt_length + "
            f"response_length = {needed}, so vLLM would cut responses short; set at least "
            f"{needed}, or null for exactly that"
        )
    if longest:
        kwargs["max_model_len"] = longest
    if on_cpu:
        if cfg.gpu_memory_utilization != DEFAULT_GPU_MEMORY_UTILIZATION:
            raise ValueError(
                "actor_rollout_ref.rollout.gpu_memory_utilization="
                f"{cfg.gpu_memory_utilization} sizes a GPU's KV cache, but this vLLM runs on "
                "a CPU, where it would take that fraction of the machine's RAM; leave it at "
                f"{DEFAULT_GPU_MEMORY_UTILIZATION} and set "
                "actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes"
            )
        del kwargs["gpu_memory_utilization"]
        kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
    kwargs.update(configured)
    return kwargs


def _computed_buffers_are_not_weights(record: logging.LogRecord) -> bool:
    """Drop vLLM's "RotaryEmbedding: Failed to load weights" of every weight sync.

    The rotary embedding holds only its cos/sin table, computed at start and never in a
    checkpoint; vLLM's layerwise reload counts it as a weight nobody loaded, warns, and puts the
    table back as it was. Other layers' warnings pass.
    """
    return not (record.args == ("RotaryEmbedding",) and "Failed to load" in str(record.msg))


def import_vllm(model_path: str) -> Any:
    """Import vLLM (ImportError naming the extras if absent) and check it can load the model.

    vLLM logs at INFO by default, a line per weight sync among them; a run's log keeps its
    warnings (``VLLM_LOGGING_LEVEL`` set by the user wins). It is read when vLLM is imported.
    """
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(VLLM_MISSING) from exc
    logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(
        _computed_buffers_are_not_weights
    )
    problem = supported_architectures_problem(model_path, vllm.ModelRegistry.get_supported_archs())
    if problem:
        raise ValueError(
            f"actor_rollout_ref.model.path: {problem}; use actor_rollout_ref.rollout.name=hf"
        )
    return vllm
