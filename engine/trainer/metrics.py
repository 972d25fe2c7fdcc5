"""Per-step metrics under verl's names (``verl/trainer/ppo/metric_utils.py``)."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import numpy as np
import torch

from engine.data import DataProto


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    if values.numel() == 0:
        return {}
    return {
        f"{prefix}/mean": values.mean().item(),
        f"{prefix}/max": values.max().item(),
        f"{prefix}/min": values.min().item(),
    }


def compute_data_metrics(batch: DataProto, *, use_critic: bool, max_response_length: int) -> dict:
    """Return score / reward / advantage / return / value and length statistics of a batch."""
    b = batch.batch
    mask = b["response_mask"].bool()  # (bs, R)
    response_length = mask.sum(-1).float()  # (bs,)
    prompt_length = b["attention_mask"][:, : b["prompts"].shape[-1]].sum(-1).float()
    metrics: dict[str, float] = {}
    metrics.update(_stats("critic/score", b["token_level_scores"].sum(-1)))
    metrics.update(_stats("critic/rewards", b["token_level_rewards"].sum(-1)))
    metrics.update(_stats("critic/advantages", b["advantages"][mask]))
    metrics.update(_stats("critic/returns", b["returns"][mask]))
    if use_critic:
        values = b["values"][mask]
        returns = b["returns"][mask]
        metrics.update(_stats("critic/values", values))
        var_returns = torch.var(returns)
        metrics["critic/vf_explained_var"] = (
            1.0 - torch.var(returns - values) / (var_returns + 1e-5)
        ).item()
    metrics.update(_stats("response_length", response_length))
    metrics["response_length/clip_ratio"] = (
        (response_length >= max_response_length).float().mean().item()
    )
    metrics.update(_stats("prompt_length", prompt_length))
    return metrics


def compute_timing_metrics(timing: dict[str, float], num_tokens: int) -> dict[str, float]:
    """Return ``timing_s/<stage>`` and per-token ``timing_per_token_ms/<stage>``."""
    metrics = {f"timing_s/{name}": seconds for name, seconds in timing.items()}
    for name, seconds in timing.items():
        if num_tokens:
            metrics[f"timing_per_token_ms/{name}"] = 1000.0 * seconds / num_tokens
    return metrics


def compute_throughput_metrics(
    num_tokens: int, step_seconds: float, n_devices: int
) -> dict[str, float]:
    """Return verl's perf metrics: tokens, time per step, tokens/s per device."""
    return {
        "perf/total_num_tokens": float(num_tokens),
        "perf/time_per_step": step_seconds,
        "perf/throughput": num_tokens / max(step_seconds, 1e-9) / max(n_devices, 1),
    }


def compute_validation_metrics(
    data_sources: list[str],
    uids: list[str],
    scores: list[float],
    preds: list[Any] | None = None,
) -> dict[str, float]:
    """Return ``val-core/<source>/reward/mean@n`` and, for n > 1, best@n / worst@n / maj@n.

    Each uid is one prompt with n sampled responses; best@n is the mean over prompts of the
    best of its n scores (pass@n for 0/1 rewards); maj@n scores the most frequent prediction
    when the reward function reports one under ``pred``.
    """
    groups: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for i, (source, uid) in enumerate(zip(data_sources, uids, strict=True)):
        groups[source][uid].append(i)
    metrics: dict[str, float] = {}
    score_arr = np.asarray(scores, dtype=np.float64)
    for source, by_prompt in groups.items():
        n = max(len(idx) for idx in by_prompt.values())
        prefix = "val-core"
        per_prompt = [score_arr[idx] for idx in by_prompt.values()]
        metrics[f"{prefix}/{source}/reward/mean@{n}"] = float(
            np.mean([s.mean() for s in per_prompt])
        )
        if n > 1:
            metrics[f"{prefix}/{source}/reward/best@{n}/mean"] = float(
                np.mean([s.max() for s in per_prompt])
            )
            metrics[f"{prefix}/{source}/reward/worst@{n}/mean"] = float(
                np.mean([s.min() for s in per_prompt])
            )
            if preds is not None:
                majority = []
                for idx in by_prompt.values():
                    votes = Counter(str(preds[i]) for i in idx)
                    top = votes.most_common(1)[0][0]
                    majority.append(next(score_arr[i] for i in idx if str(preds[i]) == top))
                metrics[f"{prefix}/{source}/reward/maj@{n}/mean"] = float(np.mean(majority))
    return metrics
