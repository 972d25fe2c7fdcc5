"""What the rollouts over a served inference engine (vLLM, SGLang) share.

- The rollout contract's columns from an engine's sampled ids and log-probs
  (:func:`response_batch`), so every backend answers with the same ``DataProto``.
- Weight sync in buckets (:func:`push_in_buckets`): the policy's ``(name, tensor)`` pairs, cast to
  the rollout's dtype and gathered from FSDP2 shards one tensor at a time, handed to the engine a
  bucket of ``update_weights_bucket_megabytes`` at a time.
- The hybrid engine's memory (:class:`ServedEngineRollout`): with ``enable_sleep_mode`` the engine
  sleeps while the actor trains and wakes in verl's order, weights first, then the new policy is
  loaded into them, then the KV cache, so the cache is never allocated while a second copy of the
  weights is in flight. A backend says how its engine releases, resumes and reloads; the order is
  written once, here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import torch

from engine.data import DataProto
from engine.rollout.hf import eos_token_ids

if TYPE_CHECKING:
    from engine.config import RolloutConfig

DEFAULT_BUCKET_BYTES = 2048 * 1024**2  # verl main's checkpoint_engine default
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}

NamedTensors = Iterable[tuple[str, torch.Tensor]]
MEMORY_TAGS = ("weights", "kv_cache")  # the parts of an engine that sleep, in wake order


def bucket_megabytes(rollout_config: RolloutConfig) -> int | None:
    """Return the weight sync's bucket size in MiB: verl 0.7's
    ``rollout.update_weights_bucket_megabytes`` where set, else verl main's
    ``rollout.checkpoint_engine.update_weights_bucket_megabytes`` (None: neither is there)."""
    legacy = getattr(rollout_config, "update_weights_bucket_megabytes", None)
    engine = getattr(rollout_config, "checkpoint_engine", None)
    return legacy or getattr(engine, "update_weights_bucket_megabytes", None)


def engine_sampling(sampling: dict[str, Any], eos_ids: list[int]) -> dict[str, Any]:
    """Return the sampling arguments vLLM and SGLang spell alike, from the worker's dict.

    ``sampling`` holds ``do_sample``, ``temperature``, ``top_k``, ``top_p`` and ``ignore_eos``;
    greedy decoding (``do_sample=False`` or temperature 0) becomes ``temperature=0``, a
    non-positive ``top_k`` the engines' ``-1`` (off), and ``ignore_eos`` samples to the length
    limit with no stop tokens. One request per prompt row (``n=1``): rows arrive repeated.
    """
    ignore_eos = bool(sampling.get("ignore_eos", False))
    greedy = not sampling.get("do_sample", True) or float(sampling.get("temperature", 1.0)) <= 0
    top_k = int(sampling.get("top_k", -1))
    return {
        "n": 1,
        "temperature": 0.0 if greedy else float(sampling.get("temperature", 1.0)),
        "top_k": top_k if top_k > 0 else -1,
        "top_p": float(sampling.get("top_p", 1.0)),
        "stop_token_ids": [] if ignore_eos else list(eos_ids),
        "ignore_eos": ignore_eos,
    }


def unpad_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """Return each row of a left-padded batch (bs, P) without its padding, as a list of ids."""
    return [row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask, strict=True)]


def assemble_responses(
    token_ids: list[list[int]],
    log_probs: list[list[float]],
    *,
    eos_ids: list[int],
    pad_token_id: int,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return ``responses``, ``response_mask``, ``log_probs`` (bs, T) and ``truncated`` (bs,).

    Rows are right-padded with ``pad_token_id`` to the longest response (at least one column).
    The mask is 1 up to and including the first EOS; tokens after it (vLLM stops there, but a
    stop id may be followed by nothing or by padding) are masked out. ``truncated`` is True where
    no EOS was produced.
    """
    width = max([len(t) for t in token_ids] + [1])
    bs = len(token_ids)
    responses = torch.full((bs, width), pad_token_id, dtype=torch.long)  # (bs, T)
    mask = torch.zeros((bs, width), dtype=torch.long)  # (bs, T)
    logp = torch.zeros((bs, width), dtype=torch.float32)  # (bs, T)
    truncated = torch.ones(bs, dtype=torch.bool)  # (bs,)
    eos = set(eos_ids)
    for i, (tokens, values) in enumerate(zip(token_ids, log_probs, strict=True)):
        end = len(tokens)
        for j, token in enumerate(tokens):
            if token in eos:
                end, truncated[i] = j + 1, False
                break
        responses[i, :end] = torch.tensor(tokens[:end], dtype=torch.long)
        mask[i, :end] = 1
        logp[i, :end] = torch.tensor(values[:end], dtype=torch.float32)
    return responses.to(device), mask.to(device), logp.to(device), truncated


def response_batch(
    prompts: DataProto,
    token_ids: list[list[int]],
    log_probs: list[list[float]],
    *,
    eos_ids: list[int],
    pad_token_id: int,
) -> DataProto:
    """Return the rollout contract's ``DataProto`` for an engine's sampled ids and log-probs.

    ``prompts`` holds the left-padded ``input_ids`` / ``attention_mask`` (bs, P). Adds
    ``prompts`` (bs, P), ``responses``, ``response_mask``, ``rollout_log_probs`` (bs, T),
    ``input_ids`` / ``attention_mask`` / ``position_ids`` (bs, P + T) and the non-tensor
    ``truncated`` flags (see :func:`assemble_responses`).
    """
    prompt_ids = prompts.batch["input_ids"]  # (bs, P)
    prompt_mask = prompts.batch["attention_mask"]  # (bs, P)
    responses, response_mask, logp, truncated = assemble_responses(
        token_ids, log_probs, eos_ids=eos_ids, pad_token_id=pad_token_id, device=prompt_ids.device
    )
    attention_mask = torch.cat([prompt_mask, response_mask], dim=-1)  # (bs, P + T)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (bs, P + T)
    tensors = {
        "prompts": prompt_ids,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompt_ids, responses], dim=-1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "rollout_log_probs": logp,
    }
    return DataProto.from_dict(tensors, {"truncated": truncated.numpy()})


def iter_buckets(weights: NamedTensors, bucket_bytes: int) -> Iterator[list[tuple[str, Any]]]:
    """Yield ``(name, tensor)`` lists of at most ``bucket_bytes`` each, in the given order.

    A tensor larger than a bucket travels alone. ``DTensor`` shards are gathered first.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    bucket: list[tuple[str, Any]] = []
    size = 0
    for name, tensor in weights:
        if hasattr(tensor, "full_tensor"):  # an FSDP2 DTensor shard: gather the full parameter
            tensor = tensor.full_tensor()
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def push_in_buckets(
    weights: torch.nn.Module | NamedTensors,
    dtype: torch.dtype,
    bucket_bytes: int,
    push: Callable[[list[tuple[str, torch.Tensor]]], None],
) -> dict[str, float]:
    """Cast ``weights`` to ``dtype`` and hand them to ``push`` in buckets of ``bucket_bytes``.

    Returns ``{"buckets": ..., "tensors": ..., "bytes": ...}``, what a rollout's
    ``load_weights`` reports.
    """
    buckets = tensors = nbytes = 0
    cast = ((name, t.detach().to(dtype)) for name, t in named_weights(weights))
    for bucket in iter_buckets(cast, bucket_bytes):
        push(bucket)
        buckets += 1
        tensors += len(bucket)
        nbytes += sum(t.numel() * t.element_size() for _, t in bucket)
    return {"buckets": float(buckets), "tensors": float(tensors), "bytes": float(nbytes)}


def named_weights(weights: torch.nn.Module | NamedTensors) -> NamedTensors:
    """Return ``(name, tensor)`` pairs: a module's state dict (LoRA merged in) or the input."""
    if not isinstance(weights, torch.nn.Module):
        return weights
    if hasattr(weights, "peft_config"):
        from engine.lora import merged_state_dict

        return merged_state_dict(weights).items()
    return weights.state_dict().items()


def generation_eos_ids(tokenizer: Any, model_path: str) -> list[int]:
    """Return the stop ids of the model at ``model_path``: its generation config's, else the tokenizer's EOS."""
    from transformers import GenerationConfig

    try:
        generation_config = GenerationConfig.from_pretrained(model_path)
    except OSError:  # no generation_config.json: the tokenizer's EOS alone
        generation_config = None
    holder = cast(Any, SimpleNamespace(generation_config=generation_config))
    return eos_token_ids(tokenizer, holder)


class ServedEngineRollout:
    """A rollout over a served engine: its stop ids, dtype, weight buckets and sleep/wake order.

    Subclasses build ``self.engine`` and say how it releases its memory (:meth:`_release`), brings
    one part back (:meth:`_resume`), takes new weights (:meth:`_reload`) and drops its cached
    prefixes after them (:meth:`_after_reload`).
    """

    engine: Any

    def __init__(
        self,
        model_path: str,
        tokenizer: Any,
        rollout_config: RolloutConfig,
        *,
        bucket_bytes: int,
        sleep_mode: bool,
    ) -> None:
        self.config = rollout_config
        self.tokenizer = tokenizer
        self.model_path = model_path
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.eos_ids = generation_eos_ids(tokenizer, model_path)
        self.dtype = DTYPES[rollout_config.dtype]
        self.bucket_bytes = bucket_bytes
        self.sleep_mode = sleep_mode
        self.asleep: set[str] = set()

    # -- hybrid engine memory ------------------------------------------------------------------
    def sleep(self) -> None:
        """Release the weights and the KV cache while the actor trains (with sleep mode on)."""
        if self.sleep_mode and not self.asleep:
            self._release()
            self.asleep = set(MEMORY_TAGS)

    def wake_up(self, tags: tuple[str, ...] = MEMORY_TAGS) -> None:
        """Bring back the sleeping parts named in ``tags``, one tag at a time, in that order."""
        for tag in tags:
            if tag in self.asleep:
                self._resume(tag)
                self.asleep.discard(tag)

    # -- weight sync ---------------------------------------------------------------------------
    def load_weights(self, weights: torch.nn.Module | NamedTensors) -> dict[str, float]:
        """Push a module's weights or ``(name, tensor)`` pairs into the engine, in buckets.

        Wakes the weights first (not the KV cache) and drops the engine's cached prefixes
        afterwards. Returns ``{"buckets": ..., "tensors": ..., "bytes": ...}``.
        """
        self.wake_up(("weights",))
        sizes = self._reload(weights)
        self._after_reload()
        return sizes

    def _release(self) -> None:
        raise NotImplementedError

    def _resume(self, tag: str) -> None:
        raise NotImplementedError

    def _reload(self, weights: torch.nn.Module | NamedTensors) -> dict[str, float]:
        raise NotImplementedError

    def _after_reload(self) -> None:
        raise NotImplementedError
