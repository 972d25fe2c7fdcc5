"""Padding-free forward passes (verl's ``use_remove_padding``): a micro-batch packed into one row.

A micro-batch arrives left-padded (prompts) and right-padded (responses), ``(bs, L)``; on
variable-length responses most of that rectangle can be padding, and every dense layer and the LM
head pay for it. Here the real tokens (``attention_mask == 1``) are gathered into one row
``(1, T)``, ``T = attention_mask.sum()``, as verl's ``unpad_input`` does; each sequence keeps its
own position ids (they restart at 0), and attention stays inside each sequence:

- the lean runner (:class:`engine.llama_forward.LlamaForward`, Qwen2/Llama without hooks) computes the dense
  layers on the packed row and attends per sequence through :class:`VarlenAttention`: on a GPU
  with ``flash_attn`` importable and half-precision activations, ``flash_attn_varlen_func`` over
  the sequences' boundaries (``cu_seqlens``); otherwise the packed queries, keys and values are
  scattered into one row per sequence (sequences start at column 0, so the plain causal mask is
  exact), sequences of similar length together in one SDPA call (``length_buckets`` of
  ``engine.roles.seqlen_balancing``), then gathered back. Attention costs about what the
  bucketed padded path's costs; the dense layers and the head run on real tokens only (on a
  27M-parameter Qwen2 and responses of 2-215 tokens, the update takes 0.85x the CPU time of the
  bucketed padded path, ``bench/training/varlen.py --passes``).
- other models (FSDP2's hooks, PEFT adapters, gradient checkpointing, the critic's
  token-classification head) run their own forward on the packed row with ``attention_mask=None``
  and the packed position ids, which transformers (>= 4.56) reads as packed sequences: a
  block-diagonal causal mask under ``sdpa``/``eager``, varlen kernels under
  ``flash_attention_2`` (load the model with ``override_config.attn_implementation``; the
  ``cu_seq_lens`` are passed explicitly then).

When the lean runner runs a micro-batch whose rows repeat a prompt (GRPO's groups), each distinct
prompt is packed once, as the padded path's shared prompt pass computes it once: the prompts'
row runs first and keeps its keys and values, then the responses' row attends to them through
:class:`PrefixAttention`, so a group of n samples costs one prompt, not n.

With Ulysses sequence parallelism (``ulysses_sequence_parallel_size`` > 1,
``engine.roles.ulysses``) the packed row is split along the sequence over the group's ranks:
each runs the dense layers on its slice and attention on all tokens of its share of the heads;
prompts are then not shared.

Only the positions that predict a response token reach the LM head (or the value head); the
outputs come back as ``(bs, R, ...)`` with zeros where no response token is predicted, which every
loss masks. They equal the padded path's within float rounding
(``tests/engine/roles/test_remove_padding.py``).
"""

from __future__ import annotations

from functools import cache
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from engine.llama_forward import LlamaForward, checkpointing
from engine.roles.seqlen_balancing import length_buckets
from engine.roles.ulysses import SequenceParallel, SplitRow, UlyssesAttention, gather_sequence
from engine.rollout.sampling import shared_prompts


class Packed(NamedTuple):
    """A micro-batch's real tokens in one row, and the way back to the batch's layout."""

    input_ids: torch.Tensor  # (1, T) the real tokens, row after row
    position_ids: torch.Tensor  # (1, T) each sequence's own positions
    seqlens: torch.Tensor  # (bs,) real tokens per row
    cu_seqlens: torch.Tensor  # (bs + 1,) int32: where each row starts in the packed row
    slot: torch.Tensor  # (bs, L) each batch position's index in the packed row, -1 if padding


def pack(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
) -> Packed:
    """Return the real tokens of ``input_ids`` (bs, L) packed into one row (see :class:`Packed`).

    Each row's real tokens must be one contiguous run (left-padded prompt, right-padded
    response): a gap would make the packed row's position ids jump inside a sequence, which
    transformers reads as a sequence boundary. ValueError otherwise.
    """
    keep = attention_mask.bool()  # (bs, L)
    seqlens = keep.sum(-1)  # (bs,)
    length = keep.shape[-1]
    first = keep.int().argmax(-1)  # (bs,) the first real token
    last = length - 1 - keep.flip(-1).int().argmax(-1)  # (bs,) the last real token
    if ((last - first + 1 != seqlens) & (seqlens > 0)).any():
        raise ValueError(
            "use_remove_padding needs each row's attention_mask to be one run of ones (padding "
            "only before the prompt and after the response); this batch has a gap inside a row: "
            "set actor_rollout_ref.model.use_remove_padding=False (and critic.model's) for it"
        )
    flat = keep.flatten().nonzero().squeeze(-1)  # (T,) batch positions kept, row-major
    slot = torch.full(keep.shape, -1, dtype=torch.long, device=keep.device)  # (bs, L)
    slot.view(-1)[flat] = torch.arange(flat.numel(), device=keep.device)
    return Packed(
        input_ids.flatten()[flat][None],  # (1, T)
        position_ids.flatten()[flat][None],  # (1, T)
        seqlens,
        F.pad(seqlens.cumsum(0), (1, 0)).to(torch.int32),  # (bs + 1,)
        slot,
    )


@cache
def _flash_varlen() -> Any:
    """Return ``flash_attn.flash_attn_varlen_func``, or None when flash-attn is not installed."""
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func


def _flash_for(q: torch.Tensor) -> Any:
    """Return ``flash_attn_varlen_func`` when it can run on ``q`` (CUDA, half precision)."""
    flash = _flash_varlen()
    if flash is not None and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        return flash
    return None


def _flash_attention(
    flash: Any,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: tuple[torch.Tensor, torch.Tensor],
    longest: tuple[int, int],
    scale: float,
) -> torch.Tensor:
    """Causal ``flash`` attention of packed queries (1, h, Tq, D) on packed keys and values
    (1, kv, Tk, D), sequences cut by ``cu_seqlens`` (queries', keys'); returns (1, h, Tq, D).
    Where a sequence has more keys than queries, the last query sees every key (flash-attn's
    causal mask is aligned at the bottom right)."""
    out = flash(
        q[0].transpose(0, 1),  # (Tq, h, D)
        k[0].transpose(0, 1),  # (Tk, kv, D)
        v[0].transpose(0, 1),
        *cu_seqlens,
        *longest,
        softmax_scale=scale,
        causal=True,
    )  # (Tq, h, D)
    return out.transpose(0, 1)[None]


class VarlenAttention:
    """Causal attention inside each packed sequence: ``attend(q, k, v, scale)`` for LlamaForward.

    ``q`` (1, h, T, D), ``k``/``v`` (1, kv, T, D) of the packed row -> (1, h, T, D). Without
    flash-attn, sequences of similar length (``length_buckets``) share one SDPA call
    over rows cut to their longest, so attention costs about what the bucketed padded path pays.
    """

    def __init__(self, seqlens: torch.Tensor, cu_seqlens: torch.Tensor) -> None:
        self.cu_seqlens = cu_seqlens  # (bs + 1,)
        self.longest = max(1, int(seqlens.max()))
        starts = cu_seqlens[:-1].long()  # (bs,)
        # Per bucket: rows, their longest m, where each token sits in the (rows, m) layout with
        # every sequence at column 0, and which packed tokens those are (None: all, in order).
        self.groups: list[tuple[int, int, torch.Tensor, torch.Tensor | None]] = []
        buckets = length_buckets(seqlens, self.longest)
        for rows, longest in buckets:
            columns = torch.arange(longest, device=seqlens.device)  # (m,)
            valid = columns[None] < seqlens[rows][:, None]  # (b, m)
            slots = valid.flatten().nonzero().squeeze(-1)  # (t,)
            tokens = (starts[rows][:, None] + columns[None])[valid]  # (t,) row-major
            self.groups.append((len(rows), longest, slots, tokens if len(buckets) > 1 else None))
        self.inverse = None  # (T,) back from bucket order to the packed order
        if len(buckets) > 1:
            self.inverse = torch.argsort(torch.cat([g[3] for g in self.groups]))  # type: ignore[misc]

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
    ) -> torch.Tensor:
        flash = _flash_for(q)
        if flash is not None:
            return _flash_attention(
                flash, q, k, v, (self.cu_seqlens, self.cu_seqlens), (self.longest,) * 2, scale
            )
        pieces = []
        for group in self.groups:
            rows, longest, slots, _ = group
            out = F.scaled_dot_product_attention(
                self._rows(q, group),
                self._rows(k, group),
                self._rows(v, group),
                is_causal=True,
                scale=scale,
                enable_gqa=True,
            )  # (b, h, m, D)
            heads, dim = out.shape[1], out.shape[-1]
            out = out.transpose(0, 1).reshape(heads, rows * longest, dim)  # (h, b m, D)
            pieces.append(out[:, slots])  # (h, t, D)
        if self.inverse is None:
            return pieces[0][None]  # (1, h, T, D)
        return torch.cat(pieces, dim=1)[:, self.inverse][None]  # (1, h, T, D)

    @staticmethod
    def _rows(x: torch.Tensor, group: tuple[int, int, torch.Tensor, torch.Tensor | None]) -> Any:
        """Scatter a bucket's tokens of a packed (1, n, T, D) into rows (b, n, m, D), zero-padded."""
        rows, longest, slots, tokens = group
        n, dim = x.shape[1], x.shape[-1]
        source = x[0] if tokens is None else x[0][:, tokens]  # (n, t, D)
        padded = x.new_zeros(n, rows * longest, dim).index_copy(1, slots, source)
        return padded.view(n, rows, longest, dim).transpose(0, 1)


class PrefixAttention:
    """Causal attention of packed responses on top of their packed prompts: ``attend`` for the
    response row of :meth:`LlamaForward.forward` with the prompt row's keys and values as ``past``.

    ``q`` (1, h, Tr, D) holds the responses' queries; ``k``/``v`` (1, kv, Tp + Tr, D) the
    prompts' keys then the responses'. Response token ``t`` of row ``i`` sees all of its prompt
    (``prompt_of[i]``) and its own tokens up to ``t``. With flash-attn (GPU, half precision) each
    row's keys are gathered into one sequence, prompt then response, for
    ``flash_attn_varlen_func`` (its causal mask aligns the last query with the last key); without
    it, rows of similar response length share one SDPA call over ``(rows, longest prompt +
    longest response)`` keys, as :class:`VarlenAttention` does.
    """

    def __init__(
        self,
        prompt_cu_seqlens: torch.Tensor,
        prompt_of: torch.Tensor,
        seqlens: torch.Tensor,
        cu_seqlens: torch.Tensor,
    ) -> None:
        device = seqlens.device
        prompt_lens = (prompt_cu_seqlens[1:] - prompt_cu_seqlens[:-1]).long()[prompt_of]  # (bs,)
        prompt_starts = prompt_cu_seqlens[:-1].long()[prompt_of]  # (bs,)
        starts = cu_seqlens[:-1].long()  # (bs,)
        total_prompt = int(prompt_cu_seqlens[-1])  # Tp: where the responses' keys begin
        self.cu_seqlens = cu_seqlens
        self.longest = max(1, int(seqlens.max()))
        # flash-attn: per row, its prompt's keys then its own, as one sequence of the key row.
        lengths = prompt_lens + seqlens  # (bs,)
        width = int(lengths.max())
        columns = torch.arange(width, device=device)  # (W,)
        in_prompt = columns[None] < prompt_lens[:, None]  # (bs, W)
        keys = torch.where(
            in_prompt,
            prompt_starts[:, None] + columns[None],
            total_prompt + starts[:, None] + columns[None] - prompt_lens[:, None],
        )  # (bs, W)
        self.flash_keys = keys[columns[None] < lengths[:, None]]  # (sum lengths,) row-major
        self.flash_cu_keys = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)  # (bs + 1,)
        self.longest_keys = width
        # SDPA: per bucket of rows, query and key indices in their (rows, m) / (rows, p + m)
        # layouts, the mask, and which packed response tokens the real queries are.
        self.groups: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        tokens = []
        for rows, m in length_buckets(seqlens, self.longest):
            p = max(1, int(prompt_lens[rows].max()))
            own = torch.arange(m, device=device)  # (m,)
            real = own[None] < seqlens[rows][:, None]  # (b, m) queries that are tokens
            queries = (starts[rows][:, None] + own[None]).clamp(max=max(0, int(cu_seqlens[-1]) - 1))
            prompt_cols = torch.arange(p, device=device)  # (p,)
            sees_prompt = prompt_cols[None] < prompt_lens[rows][:, None]  # (b, p)
            prompt_keys = (prompt_starts[rows][:, None] + prompt_cols[None]).clamp(
                max=max(0, total_prompt - 1)
            )
            key_index = torch.cat([prompt_keys, total_prompt + queries], dim=1)  # (b, p + m)
            causal = torch.ones(m, m, dtype=torch.bool, device=device).tril()  # (m, m)
            mask = torch.cat(
                [
                    sees_prompt[:, None, :].expand(-1, m, -1),
                    causal[None] & real[:, None, :],
                ],
                dim=-1,
            )[:, None]  # (b, 1, m, p + m)
            self.groups.append((queries, key_index, mask, real))
            tokens.append(queries[real])
        self.inverse = torch.argsort(torch.cat(tokens))  # (Tr,) bucket order -> packed order

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
    ) -> torch.Tensor:
        flash = _flash_for(q)
        if flash is not None:
            return _flash_attention(
                flash,
                q,
                k[:, :, self.flash_keys],  # (1, kv, K, D): each row's prompt keys, then its own
                v[:, :, self.flash_keys],
                (self.cu_seqlens, self.flash_cu_keys),
                (self.longest, self.longest_keys),
                scale,
            )
        pieces = []
        for queries, key_index, mask, real in self.groups:
            out = F.scaled_dot_product_attention(
                q[0][:, queries].transpose(0, 1),  # (b, h, m, D)
                k[0][:, key_index].transpose(0, 1),  # (b, kv, p + m, D)
                v[0][:, key_index].transpose(0, 1),
                attn_mask=mask,
                scale=scale,
                enable_gqa=True,
            )  # (b, h, m, D)
            pieces.append(out.transpose(0, 1)[:, real])  # (h, t, D)
        return torch.cat(pieces, dim=1)[:, self.inverse][None]  # (1, h, Tr, D)


def _shared_prompt_forward(
    runner: LlamaForward, batch: dict[str, torch.Tensor], groups: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run each distinct prompt once and every response on top of it, both packed.

    Returns ``rows``, ``cols`` (N,) of the response tokens predicted and the hidden states (N, H)
    that predict them: the prompt's last token for response token 0, else the response token
    before.
    """
    first, inverse = groups  # (u,), (bs,)
    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
    response_length = batch["responses"].shape[-1]
    prompt_length = input_ids.shape[-1] - response_length
    prompts = pack(
        input_ids[first, :prompt_length],
        attention_mask[first, :prompt_length],
        batch["position_ids"][first, :prompt_length],
    )  # (1, Tp): each distinct prompt once
    responses = pack(
        input_ids[:, prompt_length:],
        attention_mask[:, prompt_length:],
        batch["position_ids"][:, prompt_length:],
    )  # (1, Tr): positions go on from each prompt's
    prompt_hidden, prompt_kv = runner.forward(
        prompts.input_ids,
        prompts.position_ids,
        None,
        keep_kv=True,
        attend=VarlenAttention(prompts.seqlens, prompts.cu_seqlens),
    )  # (1, Tp, H)
    attend = PrefixAttention(prompts.cu_seqlens, inverse, responses.seqlens, responses.cu_seqlens)
    response_hidden, _ = runner.forward(
        responses.input_ids, responses.position_ids, None, past=prompt_kv, attend=attend
    )  # (1, Tr, H)
    last = prompt_hidden[0, prompts.cu_seqlens[1:].long() - 1]  # (u, H)
    hidden = torch.cat([last, response_hidden[0]])  # (u + Tr, H)
    real = attention_mask[:, prompt_length:].bool()  # (bs, R)
    before = F.pad(responses.slot, (1, 0), value=-1)[:, :-1]  # (bs, R) the token before's slot
    wanted = real & ((before >= 0) | (torch.arange(response_length, device=real.device) == 0))
    rows, cols = wanted.nonzero(as_tuple=True)  # (N,)
    index = torch.where(cols == 0, inverse[rows], len(first) + before[rows, cols])  # (N,)
    return rows, cols, hidden[index]


def _predictors(packed: Packed, attention_mask: torch.Tensor, response_length: int) -> Any:
    """Return the (row, response column) pairs with a response token, and their predictors.

    Response token ``t`` of row ``i`` (batch column ``P + t``) is predicted by the token before
    it; a pair is kept when both are real tokens. Returns ``rows`` (N,), ``cols`` (N,) and the
    predictors' indices in the packed row (N,).
    """
    slot = packed.slot[:, -response_length - 1 : -1]  # (bs, R) the predicting tokens' slots
    wanted = attention_mask[:, -response_length:].bool() & (slot >= 0)  # (bs, R)
    rows, cols = wanted.nonzero(as_tuple=True)  # (N,) each
    return rows, cols, slot[rows, cols]


def _module_forward(model: torch.nn.Module, packed: Packed, **kwargs: Any) -> Any:
    """Run the model's own forward on the packed row (transformers' packed-sequence support)."""
    if getattr(model.config, "_attn_implementation", None) == "flash_attention_2":
        longest = int(packed.seqlens.max())
        kwargs.update(
            cu_seq_lens_q=packed.cu_seqlens,
            cu_seq_lens_k=packed.cu_seqlens,
            max_length_q=longest,
            max_length_k=longest,
        )
    return model(
        input_ids=packed.input_ids,
        attention_mask=None,  # None + restarting position ids: packed sequences
        position_ids=packed.position_ids,
        use_cache=False,
        **kwargs,
    )


def _split_forward(
    model: torch.nn.Module,
    runner: LlamaForward | None,
    packed: Packed,
    predictors: torch.Tensor,
    sp: SequenceParallel,
) -> torch.Tensor:
    """Run the packed row split over the sequence-parallel group (``engine.roles.ulysses``);
    return the head's outputs at ``predictors`` (N,): logits (N, V), or a value model's (N, 1).

    The lean runner gathers its final hidden states and runs the LM head on the predictors only;
    a model's own forward (its attention set to ``"ulysses"``) gathers its head's outputs.
    """
    split = SplitRow(packed.input_ids, packed.position_ids, packed.seqlens, sp)
    attend = UlyssesAttention(VarlenAttention(split.seqlens, split.cu_seqlens), sp)
    if runner is not None:
        hidden, _ = runner.forward(split.input_ids, split.position_ids, None, attend=attend)
        return runner.logits(gather_sequence(hidden, sp)[0, predictors])  # (N, V)
    out = model(
        input_ids=split.input_ids,  # (1, T / sp)
        attention_mask=None,
        position_ids=split.position_ids,
        use_cache=False,
        ulysses_attend=attend,
    ).logits  # (1, T / sp, V or 1)
    return gather_sequence(out, sp)[0, predictors]


def packed_response_logits(
    model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    temperature: float = 1.0,
    *,
    lean: bool = True,
    sequence_parallel: SequenceParallel | None = None,
) -> torch.Tensor:
    """Return the logits (bs, R, V) that predict each response token, from one packed row.

    As :func:`engine.roles.actor.response_logits` (divided by temperature, fp32 under half
    precision); positions without a response token hold zeros. ``sequence_parallel``: the row is
    split over that group (Ulysses), every rank of it returning the whole micro-batch's logits.
    """
    attention_mask = batch["attention_mask"]  # (bs, P + R)
    bs, response_length = batch["responses"].shape
    runner = LlamaForward.build(model) if lean else None
    groups = None
    if runner is not None and not checkpointing(model) and sequence_parallel is None:
        prompt_length = attention_mask.shape[-1] - response_length
        groups = shared_prompts(
            batch["input_ids"][:, :prompt_length], attention_mask[:, :prompt_length]
        )
    if groups is not None:
        assert runner is not None
        rows, cols, hidden = _shared_prompt_forward(runner, batch, groups)
        picked = runner.logits(hidden)  # (N, V)
    else:
        packed = pack(batch["input_ids"], attention_mask, batch["position_ids"])
        rows, cols, predictors = _predictors(packed, attention_mask, response_length)  # (N,)
        if sequence_parallel is not None:
            picked = _split_forward(model, runner, packed, predictors, sequence_parallel)
        elif runner is None:
            picked = _module_forward(model, packed, logits_to_keep=predictors).logits[0]  # (N, V)
        else:
            attend = VarlenAttention(packed.seqlens, packed.cu_seqlens)
            hidden, _ = runner.forward(packed.input_ids, packed.position_ids, None, attend=attend)
            picked = runner.logits(hidden[0, predictors])  # (N, V)
    if picked.dtype in (torch.float16, torch.bfloat16):
        picked = picked.float()
    logits = picked.new_zeros(bs, response_length, picked.shape[-1])  # (bs, R, V)
    logits = logits.index_put((rows, cols), picked)
    return logits / temperature if temperature and temperature != 1.0 else logits


def packed_response_values(
    model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    *,
    sequence_parallel: SequenceParallel | None = None,
) -> torch.Tensor:
    """Return the values (bs, R) at the positions that predict each response token, packed.

    As :func:`engine.roles.critic.response_values`; positions without a response token hold
    zeros. ``sequence_parallel``: the row is split over that group, as for the logits.
    """
    attention_mask = batch["attention_mask"]
    bs, response_length = batch["responses"].shape
    packed = pack(batch["input_ids"], attention_mask, batch["position_ids"])
    rows, cols, predictors = _predictors(packed, attention_mask, response_length)
    if sequence_parallel is not None:
        picked = _split_forward(model, None, packed, predictors, sequence_parallel)[:, 0]  # (N,)
    else:
        picked = _module_forward(model, packed).logits[0, predictors, 0]  # (N,)
    if picked.dtype in (torch.float16, torch.bfloat16):
        picked = picked.float()
    return picked.new_zeros(bs, response_length).index_put((rows, cols), picked)  # (bs, R)
