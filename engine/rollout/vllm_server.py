"""vLLM in server mode: one ``AsyncLLM`` serving concurrent generation requests, as verl's agent
loop uses its rollout servers, with weight updates stamped by a policy version.

The colocated rollout (:mod:`engine.rollout.vllm_rollout`) generates a whole batch in one call
between two updates. Here many rollout workers (coroutines, or Ray actors awaiting a handle)
each ask for one response at a time, and the trainer publishes new weights while they do. The
contract the asynchronous trainer builds on:

- :meth:`VLLMServer.generate` takes one prompt's token ids and the rollout's sampling dict
  (``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``ignore_eos``, as
  :func:`~engine.rollout.vllm_rollout.sampling_kwargs` maps them) and returns a
  :class:`Generation`: the sampled ids, their log-probs (``processed_logprobs``, as the
  colocated rollout's), why it stopped, and the ``version`` of the weights that produced it.
- :meth:`VLLMServer.update_weights` loads ``(name, tensor)`` pairs or a module (LoRA merged, FSDP2
  shards gathered) in buckets, exactly as the colocated rollout does, and bumps :attr:`version`.
  It first pauses the scheduler in vLLM's ``wait`` mode: requests already running finish on the
  old weights, new ones queue until the update is done, so every response comes from one
  version. vLLM labels each token with the engine's weight version; :meth:`generate` checks that
  a response has one label and returns it, so a stamp cannot be wrong.

vLLM runs its engine core in a process of its own here (``AsyncLLM`` always does), so weights
cross a process boundary: the bucket functions are pickled (``VLLM_ALLOW_INSECURE_SERIALIZATION``,
local IPC only). A script that builds a server needs an ``if __name__ == "__main__":`` guard
(vLLM starts that process with ``spawn``).
"""

from __future__ import annotations

import asyncio
import itertools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from engine.rollout.served import DEFAULT_BUCKET_BYTES, DTYPES, NamedTensors, bucket_megabytes
from engine.rollout.vllm_args import engine_arguments, import_vllm
from engine.rollout.vllm_rollout import reload_in_buckets, sampled_log_probs, sampling_kwargs

if TYPE_CHECKING:
    from vllm.inputs import TokensPrompt

    from engine.config import RolloutConfig


@dataclass(frozen=True)
class Generation:
    """One response: ``token_ids`` and their ``log_probs`` (the same length), ``finish_reason``
    (``stop`` at a stop token, ``length`` at ``max_new_tokens``) and the policy ``version``."""

    token_ids: list[int]
    log_probs: list[float]
    finish_reason: str
    version: int


class VLLMServer:
    """An ``AsyncLLM`` engine for one policy; start it with ``await VLLMServer.launch(...)``."""

    @classmethod
    async def launch(
        cls, model_path: str, rollout_config: RolloutConfig, **kwargs: Any
    ) -> VLLMServer:
        """Start a server (arguments as the constructor's) and label its weights version 0."""
        server = cls(model_path, rollout_config, **kwargs)
        await server.engine.update_weight_version(str(server.version))
        return server

    def __init__(
        self,
        model_path: str,
        rollout_config: RolloutConfig,
        *,
        eos_ids: list[int],
        seed: int = 0,
        max_model_len: int | None = None,
        engine_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """Start the engine for ``model_path`` (version 0) with the rollout config's arguments
        (:func:`~engine.rollout.vllm_args.engine_arguments`; no sleep mode: a server keeps its
        memory); ``eos_ids`` end a response unless the sampling dict says ``ignore_eos``."""
        vllm = import_vllm(model_path)
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        kwargs = engine_arguments(
            model_path,
            rollout_config,
            on_cpu=not torch.cuda.is_available(),
            sleep_mode=False,
            max_model_len=max_model_len,
            seed=seed,
        )
        kwargs.update(engine_kwargs or {})
        # The bucket functions travel to the engine core's process pickled.
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        # AsyncLLM always runs its engine core in a process of its own; with this unset, vLLM's
        # CPU platform adds a worker process under that one as well. One process is enough.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
        self.sampling_params_cls = vllm.SamplingParams
        self.eos_ids = list(eos_ids)
        self.dtype = DTYPES[rollout_config.dtype]
        megabytes = bucket_megabytes(rollout_config)
        self.bucket_bytes = megabytes * 1024**2 if megabytes else DEFAULT_BUCKET_BYTES
        self.version = 0
        self._update = asyncio.Lock()
        self._ids = itertools.count()

    async def generate(
        self, prompt_ids: list[int], sampling: dict[str, Any], *, max_new_tokens: int
    ) -> Generation:
        """Return one response to ``prompt_ids``; many calls may run at once.

        The response stops at ``max_new_tokens``, a stop token, or where prompt and response
        reach the engine's ``max_model_len`` (``finish_reason`` ``length``); a prompt that
        alone reaches it is refused by vLLM.
        """
        params = self.sampling_params_cls(**sampling_kwargs(sampling, max_new_tokens, self.eos_ids))
        final = None
        request: TokensPrompt = {"prompt_token_ids": list(prompt_ids)}
        async for output in self.engine.generate(request, params, f"req-{next(self._ids)}"):
            final = output
        assert final is not None and final.finished
        completion = final.outputs[0]
        tokens = list(completion.token_ids)
        spans = completion.weight_versions or []
        versions = {int(span.version) for span in spans}
        if len(versions) != 1:
            raise RuntimeError(
                f"a response was generated by weight versions {sorted(versions)}; updates pause "
                "the engine until running requests finish, so this is a bug"
            )
        return Generation(
            token_ids=tokens,
            log_probs=sampled_log_probs(tokens, completion.logprobs),
            finish_reason=str(completion.finish_reason),
            version=versions.pop(),
        )

    async def update_weights(self, weights: torch.nn.Module | NamedTensors) -> dict[str, float]:
        """Load new policy weights and return the bucket sizes with the new ``version``.

        Running requests finish on the old weights first; requests that arrive meanwhile wait
        and run on the new ones. The prefix cache is cleared with the pause.
        """
        loop = asyncio.get_running_loop()

        def apply_model(fn: Any) -> Any:  # from the worker thread: one RPC at a time, in order
            rpc = self.engine.collective_rpc("apply_model", args=(fn,))
            return asyncio.run_coroutine_threadsafe(rpc, loop).result()

        async with self._update:
            await self.engine.pause_generation(mode="wait", clear_cache=True)
            try:
                # Buckets are cut (FSDP2 shards gathered) in a thread while the loop sends them.
                sizes = await asyncio.to_thread(
                    reload_in_buckets,
                    weights,
                    self.dtype,
                    self.bucket_bytes,
                    apply_model,
                    self.engine.model_config,
                )
                self.version += 1
                await self.engine.update_weight_version(str(self.version))
            finally:
                await self.engine.resume_generation()
        return {**sizes, "version": float(self.version)}

    def shutdown(self) -> None:
        """Stop the engine and its process."""
        self.engine.shutdown()
        del self.engine  # collected now, not by vLLM's __del__ at interpreter exit
