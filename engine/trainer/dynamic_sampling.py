"""DAPO's dynamic sampling (arXiv 2503.14476, section 3.2): ``algorithm.filter_groups``.

A prompt whose responses all score the same gives every response a GRPO advantage of 0, so it
spends compute and teaches nothing. As verl's ``RayDAPOTrainer.fit``, each generation batch's
groups are kept only when the filter metric varies within the group (std > 0; a group of one is
kept), and generation continues with the next prompts until ``train_batch_size`` groups are
kept; the kept groups are then cut to exactly that many. When ``max_num_gen_batches`` (> 0)
batches were not enough the step fails, as verl's does. The prompts come from the training
loader itself, so its saved position counts every batch a step consumed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine.data import DataProto

# Metrics computed from the batch's tensors; any other metric is a key of the reward info.
TENSOR_METRICS = ("seq_reward", "seq_final_reward")


@dataclass
class FilterStats:
    """What one step's filtering did, for its metrics."""

    num_gen_batches: int = 0
    kept_groups: int = 0
    dropped_groups: int = 0

    def metrics(self) -> dict[str, float]:
        """Return verl's ``train/num_gen_batches`` and the kept and dropped group counts."""
        return {
            "train/num_gen_batches": float(self.num_gen_batches),
            "train/num_kept_groups": float(self.kept_groups),
            "train/num_dropped_groups": float(self.dropped_groups),
        }


def metric_values(batch: DataProto, reward_info: dict[str, list], metric: str) -> np.ndarray:
    """Return each response's filter metric (bs,).

    ``seq_reward`` sums ``token_level_scores``; ``seq_final_reward`` sums
    ``token_level_rewards`` when the KL penalty made them, else the scores (they are equal).
    Any other metric is read from the reward info; a failed sample (None) counts as 0.
    """
    if metric in TENSOR_METRICS:
        key = "token_level_rewards" if metric == "seq_final_reward" else "token_level_scores"
        tensor = batch.batch.get(key, batch.batch["token_level_scores"])  # (bs, R)
        return tensor.sum(-1).double().numpy()  # (bs,)
    if metric not in reward_info:
        available = sorted({*reward_info, *TENSOR_METRICS} - {"reward_error"})
        raise ValueError(
            f"algorithm.filter_groups.metric={metric!r} is not produced by this reward (it gives "
            f"{', '.join(available)}); choose one of those, or set reward_model.reward_manager="
            "dapo to record each float score as acc"
        )
    return np.array([0.0 if v is None else float(v) for v in reward_info[metric]])  # (bs,)


def kept_rows(uids: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Return a mask (bs,) of the responses whose group's values vary (std > 0) or that are alone.

    ``uids`` (bs,) names each response's prompt group; ``values`` (bs,) is the filter metric.
    """
    groups: dict[Any, list[float]] = {}
    for uid, value in zip(uids, values, strict=True):
        groups.setdefault(uid, []).append(float(value))
    keep = {uid: len(vals) == 1 or float(np.std(vals)) > 0 for uid, vals in groups.items()}
    return np.array([keep[uid] for uid in uids], dtype=bool)  # (bs,)


def fill_batch(
    first: DataProto,
    more: Iterator[DataProto],
    generate: Callable[[DataProto], tuple[DataProto, dict[str, list]]],
    *,
    metric: str,
    train_batch_size: int,
    n: int,
    max_num_gen_batches: int,
    pad_token_id: int = 0,
) -> tuple[DataProto, dict[str, list], FilterStats]:
    """Return ``train_batch_size`` kept groups (``* n`` rows), their reward info and the stats.

    ``generate`` turns a batch of prompts into scored rollouts (``uid`` in the non-tensor
    batch, groups of ``n`` consecutive rows) and their reward info; ``first`` is the step's
    first batch of prompts and ``more`` yields the next ones.
    """
    stats = FilterStats()
    parts: list[DataProto] = []
    infos: list[tuple[dict[str, list], np.ndarray]] = []
    prompts = first
    while True:
        batch, info = generate(prompts)
        stats.num_gen_batches += 1
        mask = kept_rows(batch.non_tensor_batch["uid"], metric_values(batch, info, metric))
        kept = int(mask.sum()) // n
        stats.kept_groups += kept
        stats.dropped_groups += len(batch) // n - kept
        parts.append(batch[mask])  # type: ignore[arg-type]
        infos.append((info, mask))
        if stats.kept_groups >= train_batch_size:
            break
        if 0 < max_num_gen_batches <= stats.num_gen_batches:
            raise ValueError(
                f"algorithm.filter_groups: {stats.num_gen_batches} generation batches (max_num_"
                f"gen_batches={max_num_gen_batches}) kept {stats.kept_groups} of the "
                f"{train_batch_size} groups a step needs; every other group's responses scored "
                "the same. Raise algorithm.filter_groups.max_num_gen_batches (<= 0: no limit) or "
                "data.gen_batch_size, or check the data: it may be too hard or too easy for "
                "the model"
            )
        prompts = next(more)
    rows = train_batch_size * n
    batch = DataProto.concat(pad_to_common_width(parts, pad_token_id))[:rows]  # type: ignore[assignment]
    return batch, _concat_infos(infos, rows), stats  # type: ignore[return-value]


# Tensors laid out as the prompt (left-padded) or as prompt + response; every other tensor of
# the response's width is right-padded like ``responses``.
_PROMPT_KEYS = ("prompts",)
_FULL_KEYS = ("input_ids", "attention_mask", "position_ids")
_TOKEN_KEYS = ("prompts", "responses", "input_ids")


def pad_to_common_width(parts: list[DataProto], pad_token_id: int) -> list[DataProto]:
    """Return the batches padded to one prompt width P and one response width R, to concat.

    Each generation batch is padded to its own longest prompt and response; prompts gain left
    padding, responses right padding (``input_ids`` etc. both, at their two ends). Token ids pad
    with ``pad_token_id``, ``position_ids`` repeat their edge values, everything else pads with 0.
    """
    widths = [(p.batch["prompts"].shape[1], p.batch["responses"].shape[1]) for p in parts]
    top_p, top_r = max(w[0] for w in widths), max(w[1] for w in widths)
    out = []
    for part, (width_p, width_r) in zip(parts, widths, strict=True):
        left, right = top_p - width_p, top_r - width_r
        tensors = {}
        for key, value in part.batch.items():
            if key in _PROMPT_KEYS:
                tensors[key] = _pad(value, key, left, 0, pad_token_id)
            elif key in _FULL_KEYS:
                tensors[key] = _pad(value, key, left, right, pad_token_id)
            elif value.dim() >= 2 and value.shape[1] == width_r:
                tensors[key] = _pad(value, key, 0, right, pad_token_id)
            else:
                tensors[key] = value
        out.append(DataProto(tensors, part.non_tensor_batch, part.meta_info))
    return out


def _pad(value: torch.Tensor, key: str, left: int, right: int, pad_token_id: int) -> torch.Tensor:
    """Return ``value`` (bs, W, ...) with ``left`` and ``right`` columns added on dim 1."""
    if not left and not right:
        return value
    fill = pad_token_id if key in _TOKEN_KEYS else 0

    def block(width: int, edge: torch.Tensor) -> torch.Tensor:  # (bs, width, ...)
        if key == "position_ids":
            return edge.expand(-1, width, *value.shape[2:])
        return value.new_full((value.shape[0], width, *value.shape[2:]), fill)

    pieces = [block(left, value[:, :1])] if left else []
    pieces.append(value)
    if right:
        pieces.append(block(right, value[:, -1:]))
    return torch.cat(pieces, dim=1)


def _concat_infos(infos: list[tuple[dict[str, list], np.ndarray]], rows: int) -> dict[str, list]:
    """Return the kept rows' reward info, a key some batches lack None for their rows."""
    keys = list(dict.fromkeys(key for info, _ in infos for key in info))
    out: dict[str, list] = {key: [] for key in keys}
    for info, mask in infos:
        kept = np.flatnonzero(mask)
        for key in keys:
            values = info.get(key)
            out[key] += [None] * len(kept) if values is None else [values[i] for i in kept]
    return {key: values[:rows] for key, values in out.items()}
