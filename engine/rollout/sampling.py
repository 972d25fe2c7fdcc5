"""A lean batched sampling loop for causal LMs with a KV cache.

Why not ``model.generate``: RL rollouts need the log-probability of every sampled token under
the *unfiltered* distribution at the rollout temperature (that is what the actor recomputes), and
``generate`` returns processed scores (top-k/top-p already applied; transformers 5 even applies
top_k=50 by default). Its generic per-step machinery also dominates the cost on small models.
This loop does one prefill and then one single-token forward per step, samples with
temperature / top-k / top-p, and stops as soon as every sequence has produced an EOS.

Where the work goes, and what is saved:

* Rows that share a prompt (the ``n`` samples of a GRPO group) are prefilled once; the KV cache
  is then indexed out to every row (``shared_prompts``), so the prefill costs the number of
  distinct prompts, not the batch size.
* Columns that are padding in every row are dropped before the prefill (``trim_left_padding``).
* Rows that finished are dropped from the batch (and from the cache) once a quarter of the rows
  still computed are finished, so late decoding steps run only the sequences still writing. The
  sampled distribution is unchanged; the random stream is drawn for fewer rows.
* The prefill and decode steps of Qwen2 and Llama models skip the framework's per-call machinery
  (``engine.llama_forward.LlamaForward``); on the 1M-parameter tiny model that machinery was more than half
  of a decode step.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from engine.llama_forward import LlamaForward, causal_mask

# The batch key of a partial rollout's per-token policy versions (bs, T), -1 on padding.
TOKEN_VERSIONS = "rollout_token_versions"


@dataclass
class SampleOutput:
    """Result of :func:`sample_sequences`.

    ``responses`` (bs, T) right-padded with ``pad_token_id``; ``response_mask`` (bs, T) is 1 for
    real response tokens, the first EOS included; ``log_probs`` (bs, T) the sampled tokens'
    log-probabilities (0 where masked); ``truncated`` (bs,) True where no EOS was produced;
    ``token_versions`` (bs, T) the policy version each token was sampled under (-1 where masked;
    more than one version only where an ``interrupt`` swapped the weights).
    """

    responses: torch.Tensor
    response_mask: torch.Tensor
    log_probs: torch.Tensor
    truncated: torch.Tensor
    token_versions: torch.Tensor


def filter_logits(logits: torch.Tensor, top_k: int = -1, top_p: float = 1.0) -> torch.Tensor:
    """Return logits (bs, V) with everything outside the top-k / nucleus set to -inf."""
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (bs, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)  # (bs, V)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the mass before it already exceeds top_p (keeps at least one).
        drop_sorted = (cumulative - sorted_logits.softmax(-1)) > top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def trim_left_padding(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drop the leading columns (bs, L) -> (bs, L') that are padding in every row."""
    has_token = attention_mask.any(0)  # (L,)
    lead = int(has_token.long().argmax()) if bool(has_token.any()) else 0
    if lead == 0:
        return input_ids, attention_mask, position_ids
    return input_ids[:, lead:], attention_mask[:, lead:], position_ids[:, lead:]


def shared_prompts(
    prompt_ids: torch.Tensor, prompt_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Return ``(first, inverse)`` for rows (bs, P) that repeat a prompt, else None.

    ``first`` (u,) holds one row index per distinct prompt (ids and mask both equal) and
    ``inverse`` (bs,) the position in ``first`` of each row's prompt, so ``x[first][inverse]``
    rebuilds any per-row tensor ``x`` computed from the prompt alone.
    """
    bs = prompt_ids.shape[0]
    key = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=-1)  # (bs, 2P)
    unique, inverse = torch.unique(key, dim=0, return_inverse=True)
    if unique.shape[0] == bs:
        return None
    rows = torch.arange(bs, device=key.device)
    first = torch.full((unique.shape[0],), bs, dtype=torch.long, device=key.device)
    first = first.scatter_reduce(0, inverse, rows, reduce="amin")  # (u,)
    return first, inverse


@functools.cache
def cache_keyword() -> str:
    """Return the name a causal LM's forward takes its KV cache under, in this transformers.

    transformers 5.2x calls it ``cache``; earlier 5.x releases (5.17 on the GPU image) call it
    ``past_key_values``, and a ``cache=`` there vanishes into ``**kwargs`` unread, so every
    forward on top of a cache would silently recompute without it.
    """
    from transformers import LlamaForCausalLM

    parameters = inspect.signature(LlamaForCausalLM.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def with_cache(cache: DynamicCache) -> dict[str, DynamicCache]:
    """Return the forward keyword arguments that hand ``cache`` to the model."""
    return {cache_keyword(): cache}


def new_kv_cache(model: torch.nn.Module) -> DynamicCache:
    """Return an empty KV cache laid out for the model (sliding-window layers included)."""
    config = getattr(model, "config", None)
    return DynamicCache(config=config) if config is not None else DynamicCache()


@torch.no_grad()
def sample_sequences(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    eos_token_ids: list[int],
    pad_token_id: int,
    do_sample: bool = True,
    temperature: float = 1.0,
    top_k: int = -1,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    lean: bool = True,
    ignore_eos: bool = False,
    version: int = 0,
    interrupt: Callable[[], int | None] | None = None,
) -> SampleOutput:
    """Generate up to ``max_new_tokens`` for a left-padded batch ``input_ids`` (bs, P).

    Log-probs are taken from ``log_softmax(logits / temperature)`` before top-k/top-p filtering
    (temperature 1 when greedy), matching the actor's recomputation. ``lean=False`` prefills
    and decodes with the model's own forward even where :class:`LlamaForward` supports the model.
    ``ignore_eos`` samples every row to ``max_new_tokens``: an end-of-sequence token is then an
    ordinary token of the response (``rollout.ignore_eos``).

    Partial rollout: ``interrupt`` is called before each decoding step and returns None to go
    on, or the new policy version once it has loaded newer weights into ``model`` in place. The
    rows still writing are then prefilled again, prompt and response so far, under the new
    weights (the old KV cache belongs to the old ones) and go on from there; every token is
    stamped with the ``version`` it was sampled under.
    """
    bs = input_ids.shape[0]
    device = input_ids.device
    greedy = not do_sample or temperature <= 0
    scale = 1.0 if greedy else float(temperature)
    eos = torch.tensor([] if ignore_eos else eos_token_ids, dtype=torch.long, device=device)

    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (bs, P)
    input_ids, mask, position_ids = trim_left_padding(input_ids, attention_mask, position_ids)
    runner = LlamaForward.build(model) if lean else None
    prompt_ids = input_ids  # (bs, P') what a partial rollout prefills again
    groups = shared_prompts(input_ids, mask)
    prefill = slice(None) if groups is None else groups[0]
    cache, logits = _prefill(
        model, runner, input_ids[prefill], mask[prefill], position_ids[prefill]
    )  # logits (u, V)
    if groups is not None:
        cache.batch_select_indices(groups[1])
        logits = logits[groups[1]]  # (bs, V)
    next_pos = position_ids[:, -1:] + 1  # (a, 1) for the a rows still computed
    rows = torch.arange(bs, device=device)  # (a,) batch row of each computed row
    finished = torch.zeros(bs, dtype=torch.bool, device=device)  # (a,)
    tokens = torch.full((bs, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
    logps = torch.zeros(bs, max_new_tokens, device=device)
    versions = torch.full((bs, max_new_tokens), version, dtype=torch.long, device=device)
    length = max_new_tokens
    for step in range(max_new_tokens):
        logits = logits.float() / scale  # (a, V)
        log_softmax = F.log_softmax(logits, dim=-1)
        if greedy:
            token = logits.argmax(-1)
        else:
            probs = filter_logits(logits, top_k, top_p).softmax(-1)
            token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        logp = log_softmax.gather(-1, token[:, None]).squeeze(-1)  # (a,)
        token = token.masked_fill(finished, pad_token_id)
        tokens[rows, step] = token
        logps[rows, step] = logp.masked_fill(finished, 0.0)
        versions[rows, step] = version
        finished = finished | torch.isin(token, eos)
        done = int(finished.sum())
        if done == finished.shape[0] or step == max_new_tokens - 1:
            length = step + 1
            break
        if 4 * done >= finished.shape[0]:  # drop finished rows from the batch and the cache
            keep = (~finished).nonzero().squeeze(-1)
            cache.batch_select_indices(keep)
            rows, token, mask, next_pos = rows[keep], token[keep], mask[keep], next_pos[keep]
            finished = finished[keep]
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=-1)
        swapped = interrupt() if interrupt is not None else None
        if swapped is not None:
            version = swapped
            runner = LlamaForward.build(model) if lean else None
            sequences = torch.cat([prompt_ids[rows], tokens[rows, : step + 1]], dim=-1)
            positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
            cache, logits = _prefill(model, runner, sequences, mask, positions)
        elif runner is not None:
            logits = runner.decode(token[:, None], mask, next_pos, cache)
        else:
            out = model(
                input_ids=token[:, None],
                attention_mask=mask,
                position_ids=next_pos,
                **with_cache(cache),
                use_cache=True,
            )
            logits = out.logits[:, -1]
        next_pos = next_pos + 1

    responses = tokens[:, :length]  # (bs, T)
    is_eos = torch.isin(responses, eos)
    # A token is part of the response up to and including the first EOS.
    eos_before = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
    response_mask = (~eos_before).long()
    log_probs = logps[:, :length] * response_mask
    responses = responses.masked_fill(response_mask == 0, pad_token_id)
    truncated = ~is_eos.any(-1)
    token_versions = versions[:, :length].masked_fill(response_mask == 0, -1)
    return SampleOutput(responses, response_mask, log_probs, truncated, token_versions)


def _prefill(
    model: torch.nn.Module,
    runner: LlamaForward | None,
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    position_ids: torch.Tensor,
) -> tuple[DynamicCache, torch.Tensor]:
    """Return a new KV cache of the left-padded rows ``input_ids`` (n, L) under the model's
    current weights and the logits (n, V) of the token after each."""
    cache = new_kv_cache(model)
    if runner is not None:
        hidden, keys_values = runner.forward(
            input_ids, position_ids, causal_mask(mask), keep_kv=True
        )
        for index, (keys, values) in enumerate(keys_values):
            cache.update(keys, values, index)
        return cache, runner.logits(hidden[:, -1])
    logits = model(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=position_ids,
        **with_cache(cache),
        use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1]
    return cache, logits
