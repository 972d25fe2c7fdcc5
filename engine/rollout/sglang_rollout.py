"""The ``sglang`` rollout backend: generation with SGLang's offline engine, colocated (GPU).

Same contract as the ``vllm`` backend (:mod:`engine.rollout.vllm_rollout`): left-padded token
ids in, the same ``DataProto`` columns out, the same weight-sync and sleep/wake hooks, so the
trainer cannot tell the backends apart. The two share the padding, bucketing and batch-assembly
helpers; only the calls into the engine differ.

Choices, and why:

- SGLang is imported lazily, inside the constructor: its wheels pin their own torch (not the
  one vLLM pins), so it lives in its own ``sglang`` extra and CPU machines never import it.
- Prompts go in as ``input_ids`` with ``skip_tokenizer_init=True``: the trainer already holds
  the ids. Each prompt arrives already repeated ``rollout.n`` times, so every request has
  ``n=1``. Greedy decoding (``do_sample=False``, validation's default) is ``temperature=0``.
- Log-probs: ``return_logprob=True`` returns ``meta_info["output_token_logprobs"]``, one
  ``(logprob, token_id, text)`` per sampled token, taken after temperature scaling (SGLang's
  default; ``SGLANG_RETURN_ORIGINAL_LOGPROB`` would return the unscaled ones and is refused).
  The response ids are read from the same list, so ids and log-probs cannot drift apart.
- Hybrid engine: with ``enable_sleep_mode`` the engine is built with ``enable_memory_saver``
  (and ``enable_weights_cpu_backup``, as vLLM's sleep level 1 offloads weights to the CPU, so a
  generation without a weight load in between still has its weights). It sleeps
  (``release_memory_occupation``) while the actor trains and wakes
  (``resume_memory_occupation``) in verl's order: weights, then the new policy into them, then
  the KV cache; ``free_cache_engine`` puts it back to sleep after each generation.
- Weight sync pushes ``(name, tensor)`` buckets through ``Engine.update_weights_from_tensor``
  (the model's ``load_weights`` maps Hugging Face names), then flushes the radix cache once,
  since cached prefixes were computed with the old weights.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import torch

from engine.data import DataProto
from engine.rollout.names import SGLANG_MISSING
from engine.rollout.served import (
    DEFAULT_BUCKET_BYTES,
    MEMORY_TAGS,
    NamedTensors,
    ServedEngineRollout,
    engine_sampling,
    push_in_buckets,
    response_batch,
    unpad_prompts,
)

if TYPE_CHECKING:
    from engine.config import RolloutConfig


def sampling_params(sampling: dict[str, Any], max_new_tokens: int, eos_ids: list[int]) -> dict:
    """Return SGLang's ``sampling_params`` dict for one rollout call.

    ``sampling`` is the worker's dict (``do_sample``, ``temperature``, ``top_k``, ``top_p``,
    ``ignore_eos``); greedy decoding (``do_sample=False`` or temperature 0) becomes
    ``temperature=0``; ``ignore_eos`` samples to ``max_new_tokens`` with no stop tokens.
    ``no_stop_trim`` keeps the EOS in the output, where the response mask expects it.
    """
    return {
        **engine_sampling(sampling, eos_ids),
        "max_new_tokens": int(max_new_tokens),
        "no_stop_trim": True,
    }


def sampled_tokens(output: dict[str, Any]) -> tuple[list[int], list[float]]:
    """Return one request's sampled token ids and their log-probs from SGLang's output dict."""
    entries = output.get("meta_info", {}).get("output_token_logprobs")
    if entries is None:
        raise RuntimeError(
            "SGLang returned no output_token_logprobs; the rollout asks for return_logprob=True, "
            "check that the engine accepts it for this model"
        )
    return [int(e[1]) for e in entries], [float(e[0]) for e in entries]


def _original_logprobs_requested() -> bool:
    value = os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB", "")
    return value.strip().lower() in ("1", "true", "yes", "on")


class SGLangRollout(ServedEngineRollout):
    """Generate ``responses`` with an ``sglang.Engine`` and load the policy's weights into it."""

    def __init__(
        self,
        model_path: str,
        tokenizer: Any,
        rollout_config: RolloutConfig,
        *,
        max_model_len: int | None = None,
        seed: int = 0,
        engine_kwargs: dict[str, Any] | None = None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        model_overrides: dict[str, Any] | None = None,
    ) -> None:
        """Build the engine from ``model_path``.

        ``engine_kwargs`` go to ``sglang.Engine`` on top of those mapped from ``rollout_config``
        (any of SGLang's server arguments, e.g. ``attention_backend``). ``model_overrides`` (the
        config attributes the policy's ``model.override_config`` changed) reach SGLang as ``json_model_override_args``.
        """
        self.model_overrides = dict(model_overrides or {})
        super().__init__(
            model_path,
            tokenizer,
            rollout_config,
            bucket_bytes=bucket_bytes,
            sleep_mode=bool(rollout_config.enable_sleep_mode),
        )
        self.engine = self._build_engine(max_model_len, seed, engine_kwargs or {})
        if self.sleep_mode:
            self.sleep()  # the trainer builds its model and optimizer next; give it the memory

    def _build_engine(self, max_model_len: int | None, seed: int, extra: dict[str, Any]) -> Any:
        try:
            import sglang
        except ImportError as exc:
            raise ImportError(SGLANG_MISSING) from exc
        if _original_logprobs_requested():
            raise ValueError(
                "SGLANG_RETURN_ORIGINAL_LOGPROB is set: SGLang would return log-probs before "
                "temperature scaling, which the actor does not recompute; unset it"
            )
        cfg = self.config
        kwargs: dict[str, Any] = {
            "model_path": self.model_path,
            "tp_size": cfg.tensor_model_parallel_size,
            "mem_fraction_static": cfg.gpu_memory_utilization,
            "dtype": cfg.dtype,
            "random_seed": seed,
            "disable_cuda_graph": cfg.enforce_eager,
            "max_running_requests": cfg.max_num_seqs,
            "chunked_prefill_size": cfg.max_num_batched_tokens,
            "skip_tokenizer_init": True,
            "enable_memory_saver": self.sleep_mode,
            "log_level": "error",
        }
        if self.sleep_mode:
            kwargs["enable_weights_cpu_backup"] = True
        if self.model_overrides:
            kwargs["json_model_override_args"] = json.dumps(self.model_overrides)
        if max_model_len or getattr(cfg, "max_model_len", None):
            kwargs["context_length"] = max_model_len or cfg.max_model_len
        kwargs.update(extra)
        return sglang.Engine(**kwargs)

    # -- the engine's side of sleep, wake and weight sync -------------------------------------
    def _release(self) -> None:
        self.engine.release_memory_occupation(tags=list(MEMORY_TAGS))  # weights backed up on CPU

    def _resume(self, tag: str) -> None:
        self.engine.resume_memory_occupation(tags=[tag])

    def _reload(self, weights: torch.nn.Module | NamedTensors) -> dict[str, float]:
        return push_in_buckets(weights, self.dtype, self.bucket_bytes, self._push_bucket)

    def _after_reload(self) -> None:
        self.engine.flush_cache()  # the radix cache holds prefixes computed with the old weights

    def _push_bucket(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        result = self.engine.update_weights_from_tensor(named_tensors=bucket, flush_cache=False)
        if isinstance(result, tuple) and result and not result[0]:
            raise RuntimeError(f"SGLang refused the weight update: {result[1]}")

    # -- generation ----------------------------------------------------------------------------
    def generate_sequences(
        self,
        prompts: DataProto,
        *,
        max_new_tokens: int,
        sampling: dict[str, Any],
        generator: torch.Generator | None = None,
    ) -> DataProto:
        """Return the response tensors for ``prompts`` (already repeated ``n`` times).

        The same columns as :meth:`engine.rollout.vllm_rollout.VLLMRollout.generate_sequences`.
        ``generator`` is unused: SGLang samples from its own RNG, seeded at construction.
        """
        ids = unpad_prompts(prompts.batch["input_ids"], prompts.batch["attention_mask"])
        params = sampling_params(sampling, max_new_tokens, self.eos_ids)
        self.wake_up(("weights", "kv_cache"))
        outputs = self.engine.generate(input_ids=ids, sampling_params=params, return_logprob=True)
        if self.config.free_cache_engine:
            self.sleep()
        if len(outputs) != len(ids):
            raise RuntimeError(f"SGLang returned {len(outputs)} outputs for {len(ids)} prompts")
        sampled = [sampled_tokens(out) for out in outputs]
        return response_batch(
            prompts,
            [tokens for tokens, _ in sampled],
            [values for _, values in sampled],
            eos_ids=[] if sampling.get("ignore_eos") else self.eos_ids,
            pad_token_id=self.pad_id,
        )
