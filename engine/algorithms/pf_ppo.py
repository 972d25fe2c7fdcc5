"""PF-PPO: train on a resample of the batch that favours responses with reliable rewards.

Policy Filtration for RLHF (PF-PPO), Zhang et al., arXiv 2409.06957: a reward model is most
trustworthy at the extremes of its scores, so the update sees the batch resampled, with
replacement and at the same size, by a weight of each response's summed score
(``token_level_scores``, before any KL penalty), as verl's ``compute_pf_ppo_reweight_data``:

- ``pow``: ``|s|^weight_pow``;
- ``max_min``: 1 for the batch's highest and lowest scores, 0 otherwise;
- ``max_random``: 0.4 for the highest score, 0.1 otherwise.

Every weight gets ``1e-8`` added, so a row with weight 0 is drawn only when all are 0. Advantages
are computed before the resample (over the whole batch's groups), as verl does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.algorithms.names import PF_PPO_REWEIGHT_METHODS

if TYPE_CHECKING:
    from engine.data import DataProto


def pf_ppo_weights(scores: torch.Tensor, reweight_method: str, weight_pow: float) -> torch.Tensor:
    """Return PF-PPO's sampling weight of each response ``(bs,)`` from its score ``(bs,)``."""
    if reweight_method == "pow":
        weights = torch.abs(scores) ** weight_pow  # (bs,)
    elif reweight_method == "max_min":
        extreme = (scores == scores.max()) | (scores == scores.min())  # (bs,)
        weights = extreme.to(scores.dtype)  # (bs,)
    elif reweight_method == "max_random":
        weights = torch.where(scores == scores.max(), 0.4, 0.1).to(scores.dtype)  # (bs,)
    else:
        raise ValueError(
            f"algorithm.pf_ppo.reweight_method={reweight_method!r} is not a PF-PPO method; "
            f"use one of {', '.join(PF_PPO_REWEIGHT_METHODS)}."
        )
    return torch.clamp(weights + 1e-8, min=1e-8)  # (bs,)


def pf_ppo_sample_indices(
    scores: torch.Tensor,
    reweight_method: str = "pow",
    weight_pow: float = 2.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Return ``bs`` row indices ``(bs,)`` drawn with replacement by :func:`pf_ppo_weights`.

    ``generator`` defaults to torch's global generator (seeded by ``trainer.seed``), as in verl.
    """
    with torch.no_grad():
        weights = pf_ppo_weights(scores, reweight_method, weight_pow)  # (bs,)
        return torch.multinomial(weights, scores.shape[0], replacement=True, generator=generator)


def compute_pf_ppo_reweight_data(
    data: DataProto,
    reweight_method: str = "pow",
    weight_pow: float = 2.0,
    generator: torch.Generator | None = None,
) -> DataProto:
    """Return a new batch of ``len(data)`` rows of ``data`` resampled by PF-PPO's weights.

    The weights come from ``token_level_scores`` ``(bs, L)`` summed over the response; every
    tensor and non-tensor column is resampled alike, and so is every ``meta_info`` list of batch
    length (per-row values kept beside the batch), as verl does; other ``meta_info`` values are
    kept. ``data`` is left unchanged.
    """
    scores = data.batch["token_level_scores"].sum(dim=-1)  # (bs,)
    indices = pf_ppo_sample_indices(scores, reweight_method, weight_pow, generator)  # (bs,)
    resampled: DataProto = data[indices.cpu()]  # type: ignore[assignment]
    rows = indices.tolist()
    resampled.meta_info = {
        key: [value[i] for i in rows]
        if isinstance(value, list) and len(value) == len(rows)
        else value
        for key, value in data.meta_info.items()
    }
    return resampled
