"""Ulysses sequence parallelism: one packed micro-batch split along the sequence over a few ranks.

DeepSpeed-Ulysses (Jacobs et al., 2023, arXiv:2309.14509), as verl runs it for
``ulysses_sequence_parallel_size``: the ``sp`` ranks of a sequence-parallel group hold the same
micro-batch. Its packed row (``engine.roles.packing``, ``(1, T)``) is padded to a multiple of
``sp`` and each rank runs the dense layers (embedding, projections, MLP, norms) on its own
``T / sp`` tokens. Attention needs every token of a sequence, so around it one all-to-all turns
the local queries, keys and values ``(1, h, T / sp, D)`` into all tokens of ``h / sp`` heads
``(1, h / sp, T, D)`` (gather the sequence, scatter the heads), the packed causal attention runs
on them, and a second all-to-all turns the result back (gather the heads, scatter the sequence).
Activations and attention per rank fall by ``sp``; the extra cost is the two all-to-alls per layer.

Heads must split evenly: ``num_attention_heads % sp == 0``; key/value heads either split
(``kv % sp == 0``) or, when there are fewer of them than ranks (``sp % kv == 0``), are repeated
to ``sp`` first, so each rank gets the one its query heads share (verl's ``repeat_kv``).

At the end the final hidden states (the lean runner) or the head's outputs (a model's own
forward) are all-gathered along the sequence, so every rank of the group holds the micro-batch's
whole logits or values and computes the same loss. The all-gather's backward keeps the rank's own
slice of the gradient times ``sp``: each rank back-propagates only the tokens it computed, and
FSDP2 averages gradients over every rank of its mesh, sequence-parallel ones included, so the
average over a group is the group's sum (verl's ``Gather`` with ``grad_scaler``). Parameters used
after the gather (the LM head on the gathered states) get the whole gradient on every rank, whose
average is itself. The sequence-parallel ranks of one group are consecutive:
``(dp, sp) = (world / sp, sp)``, as verl's ``ulysses_device_mesh``.

A model's own forward (FSDP2, PEFT, checkpointing, the critic's head) reaches the same attention
through a transformers attention function registered as ``"ulysses"``: it runs the group's
attention when the call carries ``ulysses_attend`` and is plain ``sdpa`` otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

ATTENTION = "ulysses"  # the transformers attention implementation registered here


@dataclass(frozen=True)
class SequenceParallel:
    """This rank's sequence-parallel group: ``size`` ranks holding one micro-batch."""

    group: Any  # a torch.distributed ProcessGroup
    size: int
    rank: int  # this rank's place in the group: which slice of the sequence it computes


def sequence_parallel_group(
    size: int, key: str, model_config: Any = None
) -> SequenceParallel | None:
    """Return this rank's group of ``size`` consecutive ranks (None when ``size`` is 1).

    Every rank of the default process group must call this together (each group is created on
    all ranks). ValueError naming ``key`` unless ``size`` divides the world size and, given the
    model's config, its heads (:func:`check_heads`).
    """
    if size == 1:
        return None
    initialized = dist.is_available() and dist.is_initialized()
    world, rank = (dist.get_world_size(), dist.get_rank()) if initialized else (1, 0)
    if size < 1 or world % size:
        raise ValueError(
            f"{key}={size} must divide the {world} ranks of the role's pool (trainer.nnodes x "
            "trainer.n_gpus_per_node); the data-parallel size is ranks / sequence-parallel size"
        )
    if model_config is not None:
        check_heads(model_config, size, key)
    mine = None
    for start in range(0, world, size):
        group = dist.new_group(list(range(start, start + size)))
        if start <= rank < start + size:
            mine = SequenceParallel(group, size, rank - start)
    assert mine is not None
    return mine


def check_heads(model_config: Any, size: int, key: str) -> None:
    """Raise ValueError naming ``key`` unless the model's heads split over ``size`` ranks."""
    heads = model_config.num_attention_heads
    kv = getattr(model_config, "num_key_value_heads", None) or heads
    if heads % size or (kv % size and size % kv):
        raise ValueError(
            f"{key}={size}: the model has {heads} attention heads and {kv} key/value heads; "
            "the attention heads must be a multiple of it and the key/value heads a multiple or a "
            f"divisor of it; use a divisor of {heads} such as {_largest_divisor(heads, kv, size)}"
        )


def _largest_divisor(heads: int, kv: int, size: int) -> int:
    return max(s for s in range(1, size + 1) if heads % s == 0 and (kv % s == 0 or s % kv == 0))


# -- collectives with their gradients ---------------------------------------------------------------
def _all_to_all(x: torch.Tensor, group: Any, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Send the i-th slice of ``x`` along ``scatter_dim`` to rank i, concatenate what arrives along
    ``gather_dim`` in rank order."""
    size = dist.get_world_size(group)
    sent = torch.stack(x.chunk(size, dim=scatter_dim)).contiguous()  # (sp, ...) slice per rank
    received = torch.empty_like(sent)
    dist.all_to_all_single(received, sent, group=group)  # received[i] came from rank i
    return torch.cat(received.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, scatter_dim: int, gather_dim: int) -> Any:
        ctx.group, ctx.dims = group, (scatter_dim, gather_dim)
        return _all_to_all(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad, ctx.group, gather_dim, scatter_dim), None, None, None


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, sp: SequenceParallel, dim: int) -> Any:
        ctx.sp, ctx.dim = sp, dim
        parts = [torch.empty_like(x) for _ in range(sp.size)]
        dist.all_gather(parts, x.contiguous(), group=sp.group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        sp = ctx.sp  # this rank's slice, times sp (see the module docstring)
        return grad.chunk(sp.size, dim=ctx.dim)[sp.rank] * sp.size, None, None


def seq_to_heads(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """(b, n, T / sp, D) -> (b, n / sp, T, D): every token of this rank's heads."""
    return _AllToAll.apply(x, sp.group, 1, 2)


def heads_to_seq(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """(b, n / sp, T, D) -> (b, n, T / sp, D): every head of this rank's tokens."""
    return _AllToAll.apply(x, sp.group, 2, 1)


def gather_sequence(x: torch.Tensor, sp: SequenceParallel, dim: int = 1) -> torch.Tensor:
    """Concatenate the group's slices of ``x`` along ``dim`` (1: (1, T / sp, ...) -> (1, T, ...))."""
    return _GatherSequence.apply(x, sp, dim)


# -- the split packed row -------------------------------------------------------------------------
class UlyssesAttention:
    """``attend(q, k, v, scale)`` on this rank's slice: all-to-all, ``inner`` attention over the
    whole packed row, all-to-all back. ``q`` (1, h, T / sp, D), ``k``/``v`` (1, kv, T / sp, D)
    -> (1, h, T / sp, D); ``inner`` is a packed attention (``VarlenAttention``) of the whole row."""

    def __init__(self, inner: Any, sp: SequenceParallel) -> None:
        self.inner, self.sp = inner, sp

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
    ) -> torch.Tensor:
        kv = k.shape[1]
        if kv < self.sp.size:  # one key/value head per rank, the one its query heads share
            k = k.repeat_interleave(self.sp.size // kv, dim=1)  # (1, sp, T / sp, D)
            v = v.repeat_interleave(self.sp.size // kv, dim=1)
        q, k, v = (seq_to_heads(x, self.sp) for x in (q, k, v))  # (1, n / sp, T, D)
        return heads_to_seq(self.inner(q, k, v, scale), self.sp)  # (1, h, T / sp, D)


class SplitRow:
    """This rank's slice of a packed row padded to a multiple of ``sp`` tokens.

    The padding (``pad`` tokens at the end) is one extra sequence with its own positions, so it
    attends only to itself; no prediction is read from it.
    """

    def __init__(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, seqlens: torch.Tensor, sp: Any
    ) -> None:
        total = input_ids.shape[-1]
        self.pad = -total % sp.size
        if self.pad:
            input_ids = F.pad(input_ids, (0, self.pad))
            position_ids = torch.cat(
                [position_ids, torch.arange(self.pad, device=position_ids.device)[None]], dim=-1
            )
            seqlens = torch.cat([seqlens, seqlens.new_tensor([self.pad])])
        self.seqlens = seqlens  # (bs [+ 1],) the sequences of the padded row
        self.cu_seqlens = F.pad(seqlens.cumsum(0), (1, 0)).to(torch.int32)
        width = input_ids.shape[-1] // sp.size
        local = slice(sp.rank * width, (sp.rank + 1) * width)
        self.input_ids = input_ids[:, local]  # (1, T / sp)
        self.position_ids = position_ids[:, local]  # (1, T / sp)


def _ulysses_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    ulysses_attend: UlyssesAttention | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """A transformers attention function: the group's attention when the call carries
    ``ulysses_attend``, else sdpa. Returns (b, T, h, D) as every attention function does."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if ulysses_attend is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if dropout:
        raise ValueError(
            "Ulysses sequence parallelism runs attention without dropout; set the model's "
            "attention_dropout to 0 (override_config.attention_dropout=0)"
        )
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return ulysses_attend(query, key, value, scale).transpose(1, 2), None


def use_ulysses_attention(model: Any) -> None:
    """Route ``model``'s own attention through the registered ``"ulysses"`` function."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, _ulysses_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)  # the sdpa fallback's masks
    model.config._attn_implementation = ATTENTION


def role_forward(
    model: Any,
    padded: Callable[..., Any],
    packed: Callable[..., Any],
    *,
    remove_padding: bool,
    sequence_parallel: SequenceParallel | None,
    keys: str,
) -> tuple[Callable[..., Any], int]:
    """Return the forward a role runs on its micro-batches and its sequence-parallel size:
    ``padded`` buckets, or ``packed`` rows with ``remove_padding``, split over the Ulysses group
    ``sequence_parallel`` when there is one (its attention routed through it).

    Ulysses splits packed rows only; ``keys`` names the role's two keys for that error.
    """
    if sequence_parallel is None:
        return (packed if remove_padding else padded), 1
    if not remove_padding:
        raise ValueError(f"Ulysses sequence parallelism splits packed rows: set {keys}")
    use_ulysses_attention(model)
    return partial(packed, sequence_parallel=sequence_parallel), sequence_parallel.size
