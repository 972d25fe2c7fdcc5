"""How a loss matrix becomes the scalar a micro-batch backpropagates: verl's ``agg_loss``.

Every loss of the update (the policy losses, the KL and entropy terms, the critic's value loss)
averages its ``(bs, L)`` token losses over the response mask in one of ``LOSS_AGG_MODES``. In
the trainer a micro-batch is normalised by counts over its whole mini-batch
(:class:`GlobalBatch`, an argument of every loss), so the micro-batches' gradients add up to the
mini-batch's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.algorithms.names import LOSS_AGG_MODES
from engine.algorithms.torch_functional import check_same_shape, masked_mean, masked_sum


@dataclass(frozen=True)
class GlobalBatch:
    """What a micro-batch's loss is normalised by: counts over the whole mini-batch.

    ``tokens``: valid (mask) tokens, and ``sequences``: rows with at least one valid token, summed
    over every micro-batch of the mini-batch and every data-parallel rank. ``dp_size``: the ranks
    whose gradients FSDP averages (the loss is multiplied by it, so the average is a sum).
    ``loss_scale_factor``: the constant divisor of ``seq-mean-token-sum-norm`` (verl 0.7's
    ``actor.loss_scale_factor``); None divides by the response length. ``norm_times_dp``:
    multiply ``seq-mean-token-sum-norm`` by ``dp_size`` too (``seq_mean_token_sum_norm_times_dp``
    of the actor and the critic; verl does not).
    """

    tokens: float
    sequences: float
    dp_size: int = 1
    loss_scale_factor: float | None = None
    norm_times_dp: bool = False


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    global_batch: GlobalBatch | None = None,
) -> torch.Tensor:
    """Aggregate a ``(bs, L)`` loss matrix to a scalar over the ``(bs, L)`` mask.

    ``token-mean``: ``sum(L*m) / tokens`` (DAPO, arXiv 2503.14476). ``seq-mean-token-sum``: the
    sum over sequences with a valid token of each one's token sum, over ``sequences``.
    ``seq-mean-token-mean``: the same with per-sequence token means (GRPO's original form).
    ``seq-mean-token-sum-norm``: ``sum(L*m) / loss_scale_factor``, a constant divisor that
    defaults to ``L`` (Dr. GRPO, arXiv 2503.20783). A masked token never contributes, even when
    its loss is NaN.

    ``global_batch`` (the actor and critic pass their mini-batch's) is verl 0.7's global
    aggregation (``core_algos.agg_loss`` with ``batch_num_tokens`` / ``global_batch_size``
    / ``dp_size``): ``tokens`` and ``sequences`` count the whole mini-batch over micro-batches and
    ranks, and the result is multiplied by ``dp_size``, so summing the micro-batches' gradients
    and averaging over ranks gives the gradient of the mini-batch's loss however it was split.
    ``seq-mean-token-sum-norm`` is not multiplied by ``dp_size``, as verl's ``agg_loss``: its
    gradient, averaged over ranks, is the mean of the ranks' sums, so it halves from one rank to
    two. ``global_batch.norm_times_dp`` multiplies it as the other modes are, so the gradient is
    the mini-batch's sum whatever the rank count. Counts of zero divide by one.
    Without a global batch the counts are this micro-batch's own (``+ 1e-8``, as before).
    """
    check_same_shape(loss_mat=loss_mat, loss_mask=loss_mask)
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(
            f"Unknown loss_agg_mode {loss_agg_mode!r}; valid modes are: {', '.join(LOSS_AGG_MODES)}."
        )
    dp_size = global_batch.dp_size if global_batch is not None else 1
    if loss_agg_mode == "token-mean":
        if global_batch is None:
            return masked_mean(loss_mat, loss_mask)
        return masked_sum(loss_mat, loss_mask) / max(global_batch.tokens, 1) * dp_size
    seq_losses = masked_sum(loss_mat, loss_mask, axis=-1)  # (bs,) token sums
    if loss_agg_mode == "seq-mean-token-sum-norm":
        scale = global_batch.loss_scale_factor if global_batch is not None else None
        times = dp_size if global_batch is not None and global_batch.norm_times_dp else 1
        return seq_losses.sum() / (scale or loss_mask.shape[-1]) * times
    seq_tokens = loss_mask.sum(dim=-1)  # (bs,)
    seq_valid = (seq_tokens > 0).to(loss_mat.dtype)  # (bs,) sequences with any valid token
    if loss_agg_mode == "seq-mean-token-mean":
        seq_losses = seq_losses / (seq_tokens + 1e-8)  # (bs,) token means
    if global_batch is None:
        return masked_mean(seq_losses, seq_valid)
    return masked_sum(seq_losses, seq_valid) / max(global_batch.sequences, 1) * dp_size
