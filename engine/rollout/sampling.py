"""A lean batched sampling loop for causal LMs with a KV cache.

Why not ``model.generate``: RL rollouts need the log-probability of every sampled token under
the *unfiltered* distribution at the rollout temperature (that is what the actor recomputes), and
``generate`` returns processed scores (top-k/top-p already applied; transformers 5 even applies
top_k=50 by default). Its generic per-step machinery also dominates the cost on small models.
This loop does one prefill and then one single-token forward per step, samples with
temperature / top-k / top-p, and stops as soon as every sequence has produced an EOS.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import DynamicCache


@dataclass
class SampleOutput:
    """Result of :func:`sample_sequences`.

    ``responses`` (bs, T) right-padded with ``pad_token_id``; ``response_mask`` (bs, T) is 1 for
    real response tokens, the first EOS included; ``log_probs`` (bs, T) the sampled tokens'
    log-probabilities (0 where masked); ``truncated`` (bs,) True where no EOS was produced.
    """

    responses: torch.Tensor
    response_mask: torch.Tensor
    log_probs: torch.Tensor
    truncated: torch.Tensor


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
) -> SampleOutput:
    """Generate up to ``max_new_tokens`` for a left-padded batch ``input_ids`` (bs, P).

    Log-probs are taken from ``log_softmax(logits / temperature)`` before top-k/top-p filtering
    (temperature 1 when greedy), matching the actor's recomputation.
    """
    bs = input_ids.shape[0]
    device = input_ids.device
    greedy = not do_sample or temperature <= 0
    scale = 1.0 if greedy else float(temperature)
    eos = torch.tensor(eos_token_ids, device=device)

    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (bs, P)
    cache = DynamicCache()
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    next_pos = position_ids[:, -1:] + 1  # (bs, 1)
    mask = attention_mask
    finished = torch.zeros(bs, dtype=torch.bool, device=device)
    tokens, logps = [], []
    for step in range(max_new_tokens):
        logits = out.logits[:, -1].float() / scale  # (bs, V)
        log_softmax = F.log_softmax(logits, dim=-1)
        if greedy:
            token = logits.argmax(-1)
        else:
            probs = filter_logits(logits, top_k, top_p).softmax(-1)
            token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        logp = log_softmax.gather(-1, token[:, None]).squeeze(-1)  # (bs,)
        token = token.masked_fill(finished, pad_token_id)
        tokens.append(token)
        logps.append(logp.masked_fill(finished, 0.0))
        finished = finished | torch.isin(token, eos)
        if bool(finished.all()) or step == max_new_tokens - 1:
            break
        mask = torch.cat([mask, mask.new_ones(bs, 1)], dim=-1)
        out = model(
            input_ids=token[:, None],
            attention_mask=mask,
            position_ids=next_pos,
            cache=cache,
            use_cache=True,
        )
        next_pos = next_pos + 1

    responses = torch.stack(tokens, dim=1)  # (bs, T)
    is_eos = torch.isin(responses, eos)
    # A token is part of the response up to and including the first EOS.
    eos_before = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
    response_mask = (~eos_before).long()
    log_probs = torch.stack(logps, dim=1) * response_mask
    responses = responses.masked_fill(response_mask == 0, pad_token_id)
    truncated = ~is_eos.any(-1)
    return SampleOutput(responses, response_mask, log_probs, truncated)
