"""Per-step metrics under verl's names (``verl/trainer/ppo/metric_utils.py``).

Validation metrics are verl's ``process_validation_metrics``: per prompt, best/worst/majority of
``n`` responses estimated by bootstrap (1000 draws, seed 42), then averaged over the prompts of
each data source. The draws are verl's; max and min are taken over all draws at once instead of
verl's per-draw Python loop, which gives the same numbers.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
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
    # Multi-turn rollouts (verl's names): assistant turns, and tool calls and errors per sample.
    for key in ("num_turns", "tool_call_counts", "tool_error_counts"):
        if key in batch.non_tensor_batch:
            counts = np.asarray(batch.non_tensor_batch[key], dtype=np.float64)
            metrics.update(_stats(key, torch.from_numpy(counts)))
    return metrics


@contextmanager
def timer(name: str, timing: dict[str, float]) -> Iterator[None]:
    """Add the block's wall time to ``timing[name]`` (reported by :func:`compute_timing_metrics`)."""
    start = time.perf_counter()
    yield
    timing[name] = timing.get(name, 0.0) + time.perf_counter() - start


def compute_timing_metrics(timing: dict[str, float], num_tokens: int) -> dict[str, float]:
    """Return ``timing_s/<stage>``, per-token ``timing_per_token_ms/<stage>`` and, for an
    asynchronous trainer's step, :func:`compute_utilisation_metrics`."""
    metrics = {f"timing_s/{name}": seconds for name, seconds in timing.items()}
    for name, seconds in timing.items():
        if num_tokens:
            metrics[f"timing_per_token_ms/{name}"] = 1000.0 * seconds / num_tokens
    return {**metrics, **compute_utilisation_metrics(timing)}


def compute_utilisation_metrics(timing: dict[str, float]) -> dict[str, float]:
    """Return how busy each side of an asynchronous trainer was over the step: busy time / step.

    ``async/rollout_utilisation`` is the rollout worker's generation of the step's samples
    (``rollout_worker_gen``) over the step, ``async/trainer_utilisation`` the share of the step
    the trainer did not spend waiting for them (``gen``). Empty for a synchronous step, whose
    timing has no rollout worker (and whose ``gen`` is the generation itself, not a wait).
    """
    step = timing.get("step", 0.0)
    if "rollout_worker_gen" not in timing or step <= 0:
        return {}
    return {
        "async/rollout_utilisation": timing["rollout_worker_gen"] / step,
        "async/trainer_utilisation": (step - timing.get("gen", 0.0)) / step,
    }


def compute_throughput_metrics(
    num_tokens: int, step_seconds: float, n_devices: int
) -> dict[str, float]:
    """Return verl's perf metrics: tokens, time per step, tokens/s per device."""
    return {
        "perf/total_num_tokens": float(num_tokens),
        "perf/time_per_step": step_seconds,
        "perf/throughput": num_tokens / max(step_seconds, 1e-9) / max(n_devices, 1),
    }


def compute_rollout_probs_diff_metrics(
    rollout_log_probs: torch.Tensor, old_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """Return how far the rollout engine's token probabilities are from the trainer's.

    verl's ``calculate_debug_metrics`` (``verl/utils/debug/metrics.py``), recorded when
    ``actor_rollout_ref.rollout.calculate_log_probs`` is set: over the response tokens, the
    absolute difference ``|exp(old_log_probs) - exp(rollout_log_probs)|`` (max, mean, std) and
    the Pearson correlation of the two probabilities (https://arxiv.org/abs/2506.13585).

    Args:
        rollout_log_probs: (bs, R) log-probs the rollout sampled with.
        old_log_probs: (bs, R) log-probs of the same tokens recomputed by the actor.
        response_mask: (bs, R) 1 on response tokens.
    """
    mask = response_mask.bool()  # (bs, R)
    actor_probs = torch.exp(old_log_probs.float())[mask]  # (tokens,)
    rollout_probs = torch.exp(rollout_log_probs.float())[mask]  # (tokens,)
    diff = (actor_probs - rollout_probs).abs()  # (tokens,)
    if diff.numel() == 0:
        return {"training/rollout_probs_diff_valid": 0.0}
    pearson = torch.corrcoef(torch.stack([actor_probs, rollout_probs]))[0, 1]
    return {
        "training/rollout_probs_diff_valid": 1.0,
        "training/rollout_probs_diff_max": diff.max().item(),
        "training/rollout_probs_diff_mean": diff.mean().item(),
        "training/rollout_probs_diff_std": diff.std().item(),
        "training/rollout_actor_probs_pearson_corr": pearson.item(),
    }


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | np.integer | np.floating | np.bool_)


def _subset_sizes(n_resps: int) -> list[int]:
    """Return verl's bootstrap subset sizes ``2, 4, 8, ... < n_resps`` and ``n_resps``."""
    if n_resps <= 1:
        return []
    sizes, n = [], 2
    while n < n_resps:
        sizes.append(n)
        n *= 2
    return [*sizes, n_resps]


def bootstrap_indices(n_data: int, subset_size: int, n_bootstrap: int, seed: int) -> np.ndarray:
    """Return verl's bootstrap draws ``(n_bootstrap, subset_size)``, with replacement.

    The same numbers as verl's ``np.random.seed(seed); np.random.choice(...)``, from a private
    ``RandomState`` so numpy's global generator is left as it was.
    """
    rng = np.random.RandomState(seed)
    return rng.choice(n_data, size=(n_bootstrap, subset_size), replace=True)


def majority_value(votes: Sequence[Any], values: Sequence[float] | np.ndarray) -> float:
    """Return the value of the first sample that voted for the most common prediction; a tie
    goes to the prediction seen first (verl's ``calc_maj_val``)."""
    counts = Counter(votes)  # insertion-ordered, so max() keeps the first of equal counts
    top = max(counts, key=counts.__getitem__)
    return float(values[list(votes).index(top)])


def process_validation_metrics(
    data_sources: Sequence[str],
    sample_uids: Sequence[Any],
    infos_dict: Mapping[str, Sequence[Any]],
    seed: int = 42,
    n_bootstrap: int = 1000,
) -> dict[str, dict[str, dict[str, float]]]:
    """Return ``{data_source: {var: {metric: value}}}`` as verl's ``process_validation_metrics``.

    For each prompt (uid) and numeric variable of ``infos_dict`` over its ``N`` responses:
    ``mean@N``, ``std@N`` (population std, N > 1) and, for ``n`` in ``2, 4, ... < N`` and
    ``N``, the bootstrap (``n_bootstrap`` draws of ``n`` responses with replacement, ``seed``)
    mean and std of the best (``best@n/*``), the worst (``worst@n/*``) and, when
    ``infos_dict`` has ``pred``, the majority-vote value (``maj@n/*``); each metric is then
    averaged over a data source's prompts. Unlike verl, which skips a variable whose first
    value is a string, a variable is skipped for a prompt when any of its values is not a
    number (a reward function's ``None`` or text), instead of failing the validation.
    """
    grouped: dict[str, dict[Any, dict[str, list[Any]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for i, (source, uid) in enumerate(zip(data_sources, sample_uids, strict=True)):
        for var, column in infos_dict.items():
            grouped[source][uid][var].append(column[i])
    per_prompt: dict[str, dict[str, dict[str, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    draws: dict[tuple[int, int], np.ndarray] = {}
    for source, by_uid in grouped.items():
        for var2vals in by_uid.values():
            preds = var2vals.get("pred")
            for var, raw in var2vals.items():
                if not raw or not all(_is_number(v) for v in raw):
                    continue
                values = np.asarray(raw, dtype=np.float64)  # (N,)
                n_resps = len(values)
                metric = {f"mean@{n_resps}": float(np.mean(values))}
                if n_resps > 1:
                    metric[f"std@{n_resps}"] = float(np.std(values))
                for n in _subset_sizes(n_resps):
                    if (n_resps, n) not in draws:
                        draws[n_resps, n] = bootstrap_indices(n_resps, n, n_bootstrap, seed)
                    idx = draws[n_resps, n]  # (n_bootstrap, n)
                    best, worst = values[idx].max(axis=1), values[idx].min(axis=1)  # (B,)
                    metric[f"best@{n}/mean"], metric[f"best@{n}/std"] = _mean_std(best)
                    metric[f"worst@{n}/mean"], metric[f"worst@{n}/std"] = _mean_std(worst)
                    if preds is not None:
                        votes = [[_vote(preds[j]) for j in row] for row in idx]
                        majority = np.array(
                            [
                                majority_value(v, values[row])
                                for v, row in zip(votes, idx, strict=True)
                            ]
                        )  # (B,)
                        metric[f"maj@{n}/mean"], metric[f"maj@{n}/std"] = _mean_std(majority)
                for name, value in metric.items():
                    per_prompt[source][var][name].append(value)
    return {
        source: {
            var: {name: float(np.mean(vals)) for name, vals in metrics.items()}
            for var, metrics in var2metrics.items()
        }
        for source, var2metrics in per_prompt.items()
    }


def _mean_std(values: np.ndarray) -> tuple[float, float]:
    return float(np.mean(values)), float(np.std(values))


def _vote(pred: Any) -> Any:
    """Return a prediction as a hashable vote (a list or dict answer votes by its repr)."""
    try:
        hash(pred)
    except TypeError:
        return repr(pred)
    return pred


def validation_metric_names(
    data_src2var2metric2val: dict[str, dict[str, dict[str, float]]],
) -> dict[str, float]:
    """Return ``val-core/<source>/<var>/<metric>`` and ``val-aux/...`` as verl's ``_validate``.

    The core variable is ``acc`` when the reward reports it, else ``reward``; its ``mean``,
    ``maj`` and ``best`` metrics at the largest ``n`` are ``val-core``, everything else
    ``val-aux``.
    """
    metrics: dict[str, float] = {}
    for source, var2metric in data_src2var2metric2val.items():
        core_var = "acc" if "acc" in var2metric else "reward"
        for var, metric2val in var2metric.items():
            n_max = max(int(name.split("@")[-1].split("/")[0]) for name in metric2val)
            for name, value in metric2val.items():
                core = (
                    var == core_var
                    and name.startswith(("mean", "maj", "best"))
                    and f"@{n_max}" in name
                )
                section = "val-core" if core else "val-aux"
                metrics[f"{section}/{source}/{var}/{name}"] = value
    return metrics


def compute_validation_metrics(
    data_sources: Sequence[str],
    uids: Sequence[Any],
    scores: Sequence[float],
    preds: Sequence[Any] | None = None,
    extra_infos: Mapping[str, Sequence[Any]] | None = None,
) -> dict[str, float]:
    """Return verl's validation metrics for responses grouped by prompt ``uid``.

    ``scores`` are the summed rewards (variable ``reward``); ``extra_infos`` are the reward
    function's other per-response keys (``acc`` becomes the core variable, ``pred`` the vote of
    ``maj@n``); ``preds`` is a shorthand for ``extra_infos["pred"]``. See
    :func:`process_validation_metrics` and :func:`validation_metric_names`.
    """
    infos: dict[str, Sequence[Any]] = {"reward": list(scores), **(extra_infos or {})}
    if preds is not None:
        infos["pred"] = preds
    return validation_metric_names(process_validation_metrics(data_sources, uids, infos))


# A reward service's counts of one scoring call (``engine.rewards.remote``), as step metrics.
REWARD_SERVICE_METRICS = {
    "reward_remote_requests": "reward/remote_requests",
    "reward_remote_retries": "reward/remote_retries",
    "reward_remote_s": "timing_s/reward_remote_wait",
}


def reward_service_metrics(meta_info: dict[str, Any]) -> dict[str, float]:
    """Return the step metrics of a reward call's ``meta_info``: the remote service's requests,
    retries and seconds spent waiting on it (``REWARD_SERVICE_METRICS``)."""
    return {
        metric: float(meta_info[key])
        for key, metric in REWARD_SERVICE_METRICS.items()
        if key in meta_info
    }
