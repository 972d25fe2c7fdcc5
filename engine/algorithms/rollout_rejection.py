"""Rejection sampling by divergence estimators: verl's ``rollout_rs`` options since PR #4544.

verl's main branch (0.8.0.dev) replaced 0.7's ratio levels (``token``, ``sequence``,
``geometric`` with ``rollout_rs_threshold_lower``; ``engine.algorithms.rollout_correction``) by a
hard trust region on per-token divergences between the trainer's and the rollout's policy, with
``lr = clamp(log pi_old - log pi_rollout, -20, 20)``:

- ``k1 = -lr``, ``k2 = lr^2 / 2``, ``k3 = exp(lr) - 1 - lr`` (Schulman's estimators, all 0 when
  the two policies agree);
- ``token_kN`` keeps a token whose own ``kN`` passes; ``seq_sum_kN``, ``seq_mean_kN`` and
  ``seq_max_kN`` keep a whole response whose sum, mean or max of ``kN`` over its valid tokens
  passes (``seq_max`` of k1 is not an option: k1 is signed);
- ``k1`` passes inside ``[log lower, log upper]`` (the threshold ``"lower_upper"``, or one number
  ``u`` meaning ``1/u_u``); ``k2`` and ``k3`` pass at or under their one upper bound.

Several options, comma-separated (``"token_k1,seq_max_k3"``), must all pass; the threshold then
gives one value for all or one per option, in order. As 0.7's ``token`` level keeps
``rho in [lower, upper]``, ``token_k1`` with ``"a_b"`` keeps ``rho in [1/b, 1/a]`` (k1 is
``-log rho``): 0.7's ``(token, upper=u, lower=l)`` is ``(token_k1, "1/u_1/l")``, the same mask.

Metrics are verl's, ``rollout_rs_<option>_*`` per option and ``rollout_rs_masked_fraction`` /
``rollout_rs_seq_masked_fraction`` for all of them together.
"""

from __future__ import annotations

import math

import torch

from engine.algorithms.names import RejectionOption, parse_rejection_options
from engine.algorithms.torch_functional import masked_mean, masked_sum

SAFETY_BOUND = 20.0  # as engine.algorithms.rollout_correction


def _sequence_max(values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Return each row's max over its valid tokens (bs,), 0 for a row with none."""
    masked = values.masked_fill(~response_mask.bool(), float("-inf"))  # (bs, L)
    top = masked.max(dim=-1).values  # (bs,)
    return torch.where(top == float("-inf"), torch.zeros_like(top), top)


def _option_metrics(
    option: RejectionOption,
    stat: torch.Tensor,
    seq_stat: torch.Tensor | None,
    response_mask: torch.Tensor,
    seq_valid: torch.Tensor,
) -> dict[str, float]:
    """Return verl's ``rollout_rs_<option>_*`` statistics of the ``(bs, L)`` statistic.

    Thresholds are in the statistic's units (``log`` of the bounds for k1); a sequence option's
    max, min and fractions read its ``(bs,)`` per-sequence values of valid rows.
    """
    k1 = option.lower is not None
    upper = math.log(option.upper) if k1 else option.upper
    lower = math.log(option.lower) if option.lower is not None else 0.0
    prefix = f"rollout_rs_{option.name}"
    mask_bool = response_mask.bool()
    per_seq = seq_stat if seq_stat is not None else masked_mean(stat, response_mask, axis=-1)
    valid = per_seq[seq_valid]  # (n_valid,)
    m = {f"{prefix}_mean": masked_mean(stat, response_mask).item()}
    if seq_stat is not None and valid.numel() > 0:
        m[f"{prefix}_max"], m[f"{prefix}_min"] = valid.max().item(), valid.min().item()
        m[f"{prefix}_fraction_high"] = (valid > upper).float().mean().item()
        m[f"{prefix}_fraction_low"] = (valid < lower).float().mean().item() if k1 else 0.0
    else:
        m[f"{prefix}_max"] = stat.masked_fill(~mask_bool, float("-inf")).max().item()
        m[f"{prefix}_min"] = stat.masked_fill(~mask_bool, float("inf")).min().item()
        m[f"{prefix}_fraction_high"] = masked_mean((stat > upper).float(), response_mask).item()
        m[f"{prefix}_fraction_low"] = (
            masked_mean((stat < lower).float(), response_mask).item() if k1 else 0.0
        )
    if response_mask.sum() > 1:
        clamped = stat.clamp(min=lower, max=upper)  # (bs, L)
        mean = masked_mean(clamped, response_mask)
        var = masked_mean(clamped.square(), response_mask) - mean.square()
        m[f"{prefix}_std"] = torch.sqrt(torch.clamp(var, min=0.0)).item()
    else:
        m[f"{prefix}_std"] = 0.0
    if valid.numel() == 0:
        for name in ("mean", "std", "max", "min", "max_deviation", "fraction_high", "fraction_low"):
            m[f"{prefix}_seq_{name}"] = 0.0
        return m
    m[f"{prefix}_seq_mean"] = valid.mean().item()
    m[f"{prefix}_seq_std"] = valid.std().item() if valid.numel() > 1 else 0.0
    m[f"{prefix}_seq_max"], m[f"{prefix}_seq_min"] = valid.max().item(), valid.min().item()
    m[f"{prefix}_seq_max_deviation"] = valid.abs().max().item()  # each estimator's ideal is 0
    m[f"{prefix}_seq_fraction_high"] = (valid > upper).float().mean().item()
    if k1:
        m[f"{prefix}_seq_fraction_low"] = (valid < lower).float().mean().item()
    return m


def divergence_rejection_mask(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_rs: str,
    rollout_rs_threshold: float | str | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Return the ``(bs, L)`` response mask with the tokens or rows that fail any option set to 0,
    and verl's metrics. ``log_ratio`` (bs, L) is ``log pi_old - log pi_rollout``."""
    options = parse_rejection_options(rollout_rs, rollout_rs_threshold)
    if log_ratio.shape[0] == 0:
        return response_mask, {}
    if not response_mask.any():
        raise ValueError("response_mask must contain at least one valid token (1).")
    lr = torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)  # (bs, L)
    estimators = {"k1": -lr, "k2": 0.5 * lr**2, "k3": torch.exp(lr) - 1.0 - lr}  # (bs, L) each
    mask_bool = response_mask.bool()  # (bs, L)
    seq_valid = response_mask.sum(dim=-1) > 0  # (bs,)
    keep_all = torch.ones_like(response_mask, dtype=log_ratio.dtype)  # (bs, L)
    metrics: dict[str, float] = {}
    for option in options:
        level, estimator = option.name.rsplit("_", 1)
        token_stat = estimators[estimator]  # (bs, L)
        seq_stat = None
        if level == "seq_sum":
            seq_stat = masked_sum(token_stat, response_mask, axis=-1)  # (bs,)
        elif level == "seq_mean":
            seq_stat = masked_mean(token_stat, response_mask, axis=-1)  # (bs,)
        elif level == "seq_max":
            seq_stat = _sequence_max(token_stat, response_mask)  # (bs,)
        stat = token_stat if seq_stat is None else seq_stat.unsqueeze(-1).expand_as(token_stat)
        if option.lower is not None:  # k1: both bounds, in log space
            keep = (stat >= math.log(option.lower)) & (stat <= math.log(option.upper))
        else:
            keep = stat <= option.upper  # (bs, L)
        metrics.update(_option_metrics(option, stat, seq_stat, response_mask, seq_valid))
        keep_float = keep.to(log_ratio.dtype)  # (bs, L)
        keep_all = keep_all * keep_float
        seq_kept = (~(~keep & mask_bool)).all(dim=-1)  # (bs,)
        prefix = f"rollout_rs_{option.name}"
        metrics[f"{prefix}_masked_fraction"] = masked_mean(1 - keep_float, response_mask).item()
        valid = seq_valid.float()  # (bs,)
        metrics[f"{prefix}_seq_masked_fraction"] = (
            (((1.0 - seq_kept.to(log_ratio.dtype)) * valid).sum() / valid.sum()).item()
            if valid.sum() > 0
            else 0.0
        )
    metrics["rollout_rs_masked_fraction"] = masked_mean(1 - keep_all, response_mask).item()
    rejected_in_row = (~((keep_all > 0.5) & mask_bool) & mask_bool).any(dim=-1)  # (bs,)
    metrics["rollout_rs_seq_masked_fraction"] = rejected_in_row.float().mean().item()
    return (response_mask * keep_all).to(response_mask.dtype), metrics
