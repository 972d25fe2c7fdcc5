"""Masked reductions and log-prob helpers on padded token tensors, after verl's torch_functional.

Every reduction takes a 0/1 ``mask`` of the same shape as ``values``. Masked positions are
replaced by zero before they are summed, so a NaN or inf in padding never leaks into a result
(a plain ``values * mask`` would turn ``nan * 0`` into NaN). Means divide by ``mask.sum() + 1e-8``
exactly as verl does, so an empty mask gives 0 instead of NaN; the variance and whitening
helpers, which cannot be meaningful on fewer than two tokens, raise instead.

``logprobs_from_logits``, ``entropy_from_logits`` and ``sum_pi_squared_from_logits`` run over
``(bs, response_length, vocab)`` logits. They work on row chunks of at most ``_CHUNK_ELEMENTS``
logits, views of the input with no copy, so the temporaries of a softmax never hold more than one
chunk: the memory of verl's per-row loop, without its per-token loop on packed 2-D logits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

# 16M logits per chunk: 64 MiB of fp32 temporaries, ~110 rows of a 151k-token vocabulary.
_CHUNK_ELEMENTS = 1 << 24


def check_same_shape(**tensors: torch.Tensor) -> None:
    """Raise ValueError naming every tensor and its shape unless all shapes are equal."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        described = ", ".join(f"{name} has shape {shape}" for name, shape in shapes.items())
        raise ValueError(f"Shape mismatch: {described}; they must have the same shape.")


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Return the sum of ``values`` where ``mask`` is set, over ``axis`` (all axes if None)."""
    valid = torch.where(mask.bool(), values, torch.zeros_like(values))
    return (valid * mask).sum() if axis is None else (valid * mask).sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Return the mean of ``values`` over the masked positions: sum(v*m) / (sum(m) + 1e-8)."""
    count = mask.sum() if axis is None else mask.sum(dim=axis)
    return masked_sum(values, mask, axis) / (count + 1e-8)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Return the variance of ``values`` over the masked positions (Bessel-corrected if unbiased).

    Raises ValueError when the mask selects no token, or only one (the corrected variance
    divides by ``count - 1``); use a larger mini-batch in that case.
    """
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        count = mask.sum()
        if count == 0:
            raise ValueError(
                "masked_var needs at least one element in the mask; the response mask is empty."
            )
        if count == 1:
            raise ValueError(
                "masked_var with a mask of one element divides by zero (Bessel's correction); "
                "use a larger batch so that at least two tokens are valid."
            )
        variance = variance * (count / (count - 1))
    return variance


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True
) -> torch.Tensor:
    """Return ``(values - mean) * rsqrt(var + 1e-8)`` with masked mean and unbiased variance.

    With ``shift_mean=False`` the mean is added back, so only the scale changes.
    """
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def mask_span_end(mask: torch.Tensor) -> torch.Tensor:
    """Return, per row of ``mask`` (bs, L), one past the last nonzero position (0 if none).

    Equals ``mask.sum(-1)`` for a contiguous response mask; a multi-turn mask has gaps where the
    interaction spoke, and the response then still ends at its last assistant token.
    """
    positions = torch.arange(1, mask.shape[-1] + 1, device=mask.device)  # (L,)
    return (mask.bool() * positions).amax(dim=-1)


def clip_by_value(
    x: torch.Tensor, tensor_min: torch.Tensor | float, tensor_max: torch.Tensor | float
) -> torch.Tensor:
    """Return ``x`` clamped element-wise to ``[tensor_min, tensor_max]`` (tensors or floats)."""
    lower = torch.as_tensor(tensor_min, dtype=x.dtype, device=x.device)
    upper = torch.as_tensor(tensor_max, dtype=x.dtype, device=x.device)
    return torch.max(torch.min(x, upper), lower)


def _row_chunks(logits: torch.Tensor) -> Iterator[torch.Tensor]:
    """Yield ``(rows, vocab)`` views of ``logits (..., vocab)`` in row-major order, never copying.

    The views come from ``split`` / ``unbind``, not indexing: under autograd an indexed slice's
    backward allocates a zero tensor of the *whole* input and adds the slice's gradient into it,
    so a 75-chunk micro-batch of 0.5B-model logits (5 GB) cost 75 full-size fills and adds (on
    an H200 half the update's GPU time); ``split``'s backward concatenates the chunks once.
    """
    if logits.dim() > 2 and logits.is_contiguous():
        logits = logits.view(-1, logits.shape[-1])
    if logits.dim() > 2:  # a non-contiguous slice such as logits[:, -L - 1 : -1]
        for sub in logits.unbind(0):
            yield from _row_chunks(sub)
        return
    rows = max(1, _CHUNK_ELEMENTS // max(1, logits.shape[-1]))
    yield from logits.split(rows)


def _map_rows(
    fn: Callable[[torch.Tensor, slice], torch.Tensor], logits: torch.Tensor
) -> torch.Tensor:
    """Apply ``fn(chunk, rows)`` to each row chunk and return the results as ``logits.shape[:-1]``."""
    outputs, start = [], 0
    for chunk in _row_chunks(logits):
        outputs.append(fn(chunk, slice(start, start + chunk.shape[0])))
        start += chunk.shape[0]
    if not outputs:  # no rows at all
        return logits.new_zeros(logits.shape[:-1])
    out = outputs[0] if len(outputs) == 1 else torch.cat(outputs)
    return out.view(logits.shape[:-1])


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Return ``log_softmax(logits)`` gathered at ``labels``.

    Shapes: logits ``(bs, L, vocab)`` (any leading shape), labels ``(bs, L)`` -> ``(bs, L)``.
    fp32/fp64 use ``x[label] - logsumexp(x)``; half precision, where that difference loses
    accuracy, takes ``log_softmax`` per chunk as verl does.
    """
    if tuple(logits.shape[:-1]) != tuple(labels.shape):
        raise ValueError(
            f"logits has shape {tuple(logits.shape)} and labels has shape {tuple(labels.shape)}; "
            "labels must match the logits' shape without the vocabulary dimension."
        )
    flat_labels = labels.reshape(-1, 1)
    exact = logits.dtype in (torch.float32, torch.float64)

    def pick(chunk: torch.Tensor, rows: slice) -> torch.Tensor:
        index = flat_labels[rows]
        if exact:
            return chunk.gather(-1, index).squeeze(-1) - torch.logsumexp(chunk, dim=-1)
        return torch.log_softmax(chunk, dim=-1).gather(-1, index).squeeze(-1)

    return _map_rows(pick, logits)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Return the entropy of ``softmax(logits)``: ``logsumexp(x) - sum(softmax(x) * x)``.

    Shapes: logits ``(bs, L, vocab)`` (any leading shape) -> ``(bs, L)``.
    """

    def entropy(chunk: torch.Tensor, rows: slice) -> torch.Tensor:
        probs = torch.softmax(chunk, dim=-1)
        return torch.logsumexp(chunk, dim=-1) - (probs * chunk).sum(dim=-1)

    return _map_rows(entropy, logits)


def sum_pi_squared_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Return ``sum_v softmax(logits)_v ** 2``, as verl's ``calculate_sum_pi_squared_from_logits``:
    ``exp(logsumexp(2 x) - 2 logsumexp(x))``, exact and free of underflow in the squares.

    The per-token input of the optimal token baselines (``1 - 2 pi_t + sum_v pi_v^2`` is the
    squared norm of the score function). Shapes: logits ``(bs, L, vocab)`` (any leading shape)
    -> ``(bs, L)``.
    """

    def sum_squares(chunk: torch.Tensor, rows: slice) -> torch.Tensor:
        return torch.exp(
            torch.logsumexp(2.0 * chunk, dim=-1) - 2.0 * torch.logsumexp(chunk, dim=-1)
        )

    return _map_rows(sum_squares, logits)
