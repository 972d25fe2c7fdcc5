"""Rollout correction: weights and masks between the trainer's and the rollout's log-probs.

verl 0.7's ``trainer/ppo/rollout_corr_helper.py`` (``algorithm.rollout_correction.*``): the
rollout engine samples from ``pi_rollout`` (another kernel, precision or a staler checkpoint),
the trainer recomputes ``pi_old``; ``rho = pi_old / pi_rollout`` per token, in log space
(clamped at ``+-20`` before ``exp``).

- Truncated importance sampling (``rollout_is``): ``token`` weights ``rho_t``, or ``sequence``
  weights ``prod_t rho_t``, truncated at ``rollout_is_threshold`` and detached; the policy loss
  multiplies its token losses by them. ``rollout_is_batch_normalize`` rescales them to mean 1.
- Rejection sampling (``rollout_rs``): ``token``, ``sequence`` (product) or ``geometric``
  (``exp(mean log rho)``) ratios outside ``[lower, upper]`` are masked out of the response mask
  (verl 0.7); or verl main's divergence options (``token_k1`` ... ``seq_max_k3``, several
  comma-separated), ``engine.algorithms.rollout_rejection``.
- Token veto (``rollout_token_veto_threshold``): a sequence with any ``rho_t`` under it is masked.
- Off-policy diagnostics: KL, k3 KL, perplexities and chi-square divergences.

Every metric is named as verl's helper names it, under ``rollout_corr/``. Bypass mode uses the
rollout's log-probs as ``pi_old`` and corrects inside its loss
(``engine.algorithms.policy_loss.bypass_mode``).

Liu, Li, Fu, Wang, Liu, Shen (2025), "When Speed Kills Stability: Demystifying RL Collapse from
the Training-Inference Mismatch", https://richardli.xyz/rl-collapse; Yao et al., "Your
Efficient RL Framework Secretly Brings You Off-Policy RL Training" (truncated IS).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from engine.algorithms.names import (
    ROLLOUT_IS_LEVELS,
    ROLLOUT_RS_LEVELS,
    ROLLOUT_RS_OPTIONS,
    is_divergence_rs,
)
from engine.algorithms.rollout_rejection import divergence_rejection_mask
from engine.algorithms.torch_functional import check_same_shape, masked_mean, masked_sum

if TYPE_CHECKING:
    from engine.config.algorithm import RolloutCorrectionConfig

# exp(20) ~ 4.9e8 and exp(-20) ~ 2e-9: the bounds of every exponentiated log ratio (verl's).
SAFETY_BOUND = 20.0
METRIC_PREFIX = "rollout_corr/"


def _aggregate_ratio(
    log_ratio: torch.Tensor, response_mask: torch.Tensor, level: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(weights (bs, L), log ratio for metrics)`` at ``level``.

    ``token``: ``exp(log_ratio)`` and the ``(bs, L)`` log ratio; ``sequence``: the sum of each
    row's log ratios, ``geometric``: their mean, each ``(bs, 1)`` and broadcast to ``(bs, L)``.
    """
    if level == "token":
        log_agg = log_ratio  # (bs, L)
    elif level == "sequence":
        log_agg = masked_sum(log_ratio, response_mask, axis=-1).unsqueeze(-1)  # (bs, 1)
    else:  # geometric
        log_agg = masked_mean(log_ratio, response_mask, axis=-1).unsqueeze(-1)  # (bs, 1)
    weights = torch.exp(torch.clamp(log_agg, -SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio)
    return weights, log_agg


def _weight_metrics(
    name: str,
    weights: torch.Tensor,
    log_agg: torch.Tensor,
    response_mask: torch.Tensor,
    token_level: bool,
    upper: float,
    lower: float,
) -> dict[str, float]:
    """Return verl's ``{name}_*`` statistics of ``(bs, L)`` weights (``rollout_is``/``rollout_rs``).

    Sequence-level max/min and threshold fractions come from the unclamped ``(bs, 1)`` log
    ratios; std and effective sample size use the weights clamped to ``[lower, upper]``.
    """
    if not response_mask.any():
        raise ValueError("response_mask must contain at least one valid token (1).")
    mask_bool = response_mask.bool()
    m: dict[str, float] = {f"{name}_mean": masked_mean(weights, response_mask).item()}
    if token_level:
        m[f"{name}_ratio_fraction_high"] = masked_mean(
            (weights > upper).float(), response_mask
        ).item()
        m[f"{name}_ratio_fraction_low"] = masked_mean(
            (weights < lower).float(), response_mask
        ).item()
        m[f"{name}_max"] = weights.masked_fill(~mask_bool, float("-inf")).max().item()
        m[f"{name}_min"] = weights.masked_fill(~mask_bool, float("inf")).min().item()
    else:
        m[f"{name}_max"] = torch.exp(torch.clamp(log_agg.max(), max=SAFETY_BOUND)).item()
        m[f"{name}_min"] = torch.exp(log_agg.min()).item()
        upper_log, lower_log = torch.log(torch.tensor(upper)), torch.log(torch.tensor(lower))
        m[f"{name}_ratio_fraction_high"] = (log_agg > upper_log).float().mean().item()
        m[f"{name}_ratio_fraction_low"] = (log_agg < lower_log).float().mean().item()
    clamped = weights.clamp(min=lower, max=upper)  # (bs, L)
    if response_mask.sum() > 1:
        mean = masked_mean(clamped, response_mask)
        var = masked_mean(clamped.square(), response_mask) - mean.square()
        m[f"{name}_std"] = torch.sqrt(torch.clamp(var, min=0.0)).item()
    else:
        m[f"{name}_std"] = 0.0
    normalised = clamped / (masked_mean(clamped, response_mask) + 1e-8)  # (bs, L)
    m[f"{name}_eff_sample_size"] = 1.0 / masked_mean(normalised.square(), response_mask).item()
    seq_mean = masked_mean(weights, response_mask, axis=-1)  # (bs,)
    m[f"{name}_seq_mean"] = seq_mean.mean().item()
    m[f"{name}_seq_std"] = seq_mean.std().item() if seq_mean.numel() > 1 else 0.0
    m[f"{name}_seq_max"] = seq_mean.max().item()
    m[f"{name}_seq_min"] = seq_mean.min().item()
    m[f"{name}_seq_max_deviation"] = (seq_mean - 1.0).abs().max().item()
    m[f"{name}_seq_fraction_high"] = (seq_mean > upper).float().mean().item()
    m[f"{name}_seq_fraction_low"] = (seq_mean < lower).float().mean().item()
    return m


def compute_rollout_correction_weights(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str = "token",
    rollout_is_threshold: float = 2.0,
    rollout_is_batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Return truncated IS weights ``(bs, L)`` (0 on padding, detached) and their metrics.

    ``log_ratio`` (bs, L) is ``log pi_old - log pi_rollout``. ``token``: ``min(rho_t, C)``;
    ``sequence``: ``min(prod_t rho_t, C)`` on every token of the row, ``C`` the threshold.
    Metrics (``rollout_is_*``) describe the weights before truncation. With batch normalisation
    the truncated weights are divided by their mean (over tokens, or over sequences), recorded as
    ``rollout_is_batch_norm_factor``.
    """
    if rollout_is not in ROLLOUT_IS_LEVELS:
        raise ValueError(f"Invalid rollout_is: {rollout_is!r}; use one of {ROLLOUT_IS_LEVELS}.")
    if rollout_is_threshold <= 0:
        raise ValueError(f"rollout_is_threshold must be positive, got {rollout_is_threshold}.")
    check_same_shape(log_ratio=log_ratio, response_mask=response_mask)
    weights, log_agg = _aggregate_ratio(log_ratio, response_mask, rollout_is)
    weights = weights * response_mask  # (bs, L) 0 on padding
    metrics = _weight_metrics(
        "rollout_is",
        weights,
        log_agg,
        response_mask,
        rollout_is == "token",
        rollout_is_threshold,
        1.0 / rollout_is_threshold,
    )
    # IS weights change the measure, not the objective: no gradient flows through them.
    weights = weights.clamp(max=rollout_is_threshold).detach()  # (bs, L)
    if rollout_is_batch_normalize:
        if rollout_is == "token":
            mean = masked_mean(weights, response_mask)
        else:
            seq_weights = masked_mean(weights, response_mask, axis=-1)  # (bs,)
            seq_valid = (response_mask.sum(dim=-1) > 0).to(weights.dtype)  # (bs,)
            mean = (seq_weights * seq_valid).sum() / seq_valid.sum().clamp_min(1e-8)
        if mean > 1e-8:
            weights = weights / mean
            metrics["rollout_is_batch_norm_factor"] = mean.item()
        else:
            metrics["rollout_is_batch_norm_factor"] = 1.0
    return weights, metrics


def compute_rollout_rejection_mask(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_rs: str = "token",
    rollout_rs_threshold: float | str | None = None,
    rollout_rs_threshold_lower: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Return the response mask ``(bs, L)`` with outliers rejected, and the ``rollout_rs_*`` metrics.

    verl 0.7's levels: a token (``token``) or a whole row (``sequence``: ``prod rho_t``;
    ``geometric``: ``exp(mean log rho_t)``) is kept when its ratio lies in ``[lower, upper]``;
    ``lower`` defaults to ``1 / upper``. verl main's divergence options (``token_k1``, ...,
    comma-separated) go to :func:`~engine.algorithms.rollout_rejection.divergence_rejection_mask`
    (``rollout_rs_threshold_lower`` must then be None: their threshold string holds the bounds).
    ``rollout_rs_masked_fraction``: share of valid tokens rejected;
    ``rollout_rs_seq_masked_fraction``: share of rows with a rejection.
    """
    check_same_shape(log_ratio=log_ratio, response_mask=response_mask)
    if is_divergence_rs(rollout_rs):
        if rollout_rs_threshold_lower is not None:
            raise ValueError(
                f"rollout_rs_threshold_lower applies to verl 0.7's levels only; for {rollout_rs} "
                "write the bounds into rollout_rs_threshold as 'lower_upper'"
            )
        return divergence_rejection_mask(log_ratio, response_mask, rollout_rs, rollout_rs_threshold)
    if rollout_rs not in ROLLOUT_RS_LEVELS:
        raise ValueError(
            f"Invalid rollout_rs: {rollout_rs!r}; use one of {ROLLOUT_RS_LEVELS} (verl 0.7) or "
            f"of {ROLLOUT_RS_OPTIONS}, comma-separated (verl main)."
        )
    if rollout_rs_threshold is None:
        raise ValueError("rollout_rs_threshold must be provided for rejection sampling.")
    upper = float(rollout_rs_threshold)
    lower = rollout_rs_threshold_lower if rollout_rs_threshold_lower is not None else 1.0 / upper
    weights, log_agg = _aggregate_ratio(log_ratio, response_mask, rollout_rs)
    keep = ((weights >= lower) & (weights <= upper)).float()  # (bs, L)
    metrics = _weight_metrics(
        "rollout_rs", weights, log_agg, response_mask, rollout_rs == "token", upper, lower
    )
    metrics["rollout_rs_masked_fraction"] = masked_mean(1 - keep, response_mask).item()
    if rollout_rs == "token":
        seq_rejected = masked_sum(1 - keep, response_mask, axis=-1) > 0  # (bs,)
    else:
        seq_rejected = keep[:, 0] == 0  # (bs,) one decision per row
    metrics["rollout_rs_seq_masked_fraction"] = seq_rejected.float().mean().item()
    return response_mask * keep, metrics


def compute_offpolicy_metrics(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor | None, response_mask: torch.Tensor
) -> dict[str, float]:
    """Return the off-policy diagnostics between ``pi_old`` and ``pi_rollout`` (no prefix).

    ``training_ppl`` / ``training_log_ppl`` (batch means of per-row perplexity); with rollout
    log-probs also ``kl`` (``E[log pi_rollout - log pi_old]``), ``k3_kl`` (``E[rho - log rho - 1]``),
    ``rollout_ppl``, ``rollout_log_ppl``, ``log_ppl_diff`` (mean, abs, max, min), ``ppl_ratio``,
    ``chi2_token`` (``E[rho^2] - 1``) and ``chi2_seq`` (``E[(prod rho)^2] - 1``). All (bs, L).
    """
    if not response_mask.any():
        raise ValueError("response_mask must contain at least one valid token (1).")
    train_mean = masked_mean(old_log_prob, response_mask, axis=-1)  # (bs,)
    m = {
        "training_ppl": torch.exp(-train_mean).mean().item(),
        "training_log_ppl": (-train_mean).mean().item(),
    }
    if rollout_log_prob is None:
        return m
    log_ratio = old_log_prob - rollout_log_prob  # (bs, L)
    m["kl"] = masked_mean(-log_ratio, response_mask).item()
    m["k3_kl"] = masked_mean(torch.exp(log_ratio) - log_ratio - 1, response_mask).item()
    rollout_mean = masked_mean(rollout_log_prob, response_mask, axis=-1)  # (bs,)
    m["rollout_ppl"] = torch.exp(-rollout_mean).mean().item()
    m["rollout_log_ppl"] = (-rollout_mean).mean().item()
    log_ppl_diff = rollout_mean - train_mean  # (bs,)
    m["log_ppl_diff"] = log_ppl_diff.mean().item()
    m["log_ppl_abs_diff"] = log_ppl_diff.abs().mean().item()
    m["log_ppl_diff_max"] = log_ppl_diff.max().item()
    m["log_ppl_diff_min"] = log_ppl_diff.min().item()
    m["ppl_ratio"] = torch.exp(log_ppl_diff).mean().item()
    rho = torch.exp(torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))  # (bs, L)
    m["chi2_token"] = (masked_mean(rho.square(), response_mask) - 1.0).item()
    log_seq = torch.clamp(
        masked_sum(log_ratio, response_mask, axis=-1), -SAFETY_BOUND, SAFETY_BOUND
    )
    m["chi2_seq"] = (torch.exp(2.0 * log_seq).mean() - 1.0).item()
    return m


def compute_rollout_correction_and_rejection_mask(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str | None = None,
    rollout_is_threshold: float | None = 2.0,
    rollout_rs: str | None = None,
    rollout_rs_threshold: float | str | None = 2.0,
    rollout_rs_threshold_lower: float | None = None,
    rollout_token_veto_threshold: float | None = None,
    rollout_is_batch_normalize: bool = False,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """Return ``(IS weights or None, response mask after rejection and veto, metrics)``.

    All tensors (bs, L). IS weights only when ``rollout_is`` is set; rejection only when
    ``rollout_rs`` is; the veto rejects every row holding a token with ``rho_t`` under
    ``rollout_token_veto_threshold`` (``rollout_is_veto_fraction``,
    ``rollout_is_catastrophic_token_fraction``, 0 when off). Metrics carry ``rollout_corr/``.
    """
    if not response_mask.any():
        raise ValueError("response_mask must contain at least one valid token (1).")
    check_same_shape(
        old_log_prob=old_log_prob, rollout_log_prob=rollout_log_prob, response_mask=response_mask
    )
    log_ratio = old_log_prob - rollout_log_prob  # (bs, L)
    metrics: dict[str, float] = {}
    weights = None
    if rollout_is is not None and rollout_is_threshold is not None:
        weights, is_metrics = compute_rollout_correction_weights(
            log_ratio, response_mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize
        )
        metrics.update(is_metrics)
    mask = response_mask.clone()
    if rollout_rs is not None:
        if rollout_rs_threshold is None:
            raise ValueError(
                "rollout_rs_threshold must be explicitly provided when rollout_rs is enabled; "
                "set algorithm.rollout_correction.rollout_rs_threshold."
            )
        mask, rs_metrics = compute_rollout_rejection_mask(
            log_ratio, response_mask, rollout_rs, rollout_rs_threshold, rollout_rs_threshold_lower
        )
        metrics.update(rs_metrics)
    if rollout_token_veto_threshold is not None:
        if rollout_token_veto_threshold <= 0:
            raise ValueError(
                f"rollout_token_veto_threshold must be positive, got {rollout_token_veto_threshold}."
            )
        log_veto = torch.log(torch.tensor(rollout_token_veto_threshold, device=log_ratio.device))
        catastrophic = (log_ratio < log_veto) & response_mask.bool()  # (bs, L)
        vetoed = catastrophic.any(dim=-1, keepdim=True)  # (bs, 1)
        metrics["rollout_is_veto_fraction"] = vetoed.float().mean().item()
        metrics["rollout_is_catastrophic_token_fraction"] = masked_mean(
            catastrophic.float(), response_mask
        ).item()
        mask = mask * (~vetoed).float()
    else:
        metrics["rollout_is_veto_fraction"] = 0.0
        metrics["rollout_is_catastrophic_token_fraction"] = 0.0
    metrics.update(compute_offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask))
    return weights, mask, {METRIC_PREFIX + key: value for key, value in metrics.items()}


def correction_settings(config: RolloutCorrectionConfig | Mapping[str, Any]) -> dict[str, Any]:
    """Return the keyword arguments of :func:`compute_rollout_correction_and_rejection_mask`
    from ``algorithm.rollout_correction`` (a config section or a dict)."""
    get = config.get if isinstance(config, dict) else lambda key: getattr(config, key)
    names = (
        "rollout_is",
        "rollout_is_threshold",
        "rollout_rs",
        "rollout_rs_threshold",
        "rollout_rs_threshold_lower",
        "rollout_token_veto_threshold",
        "rollout_is_batch_normalize",
    )
    return {name: get(name) for name in names}


def rollout_correction_active(config: RolloutCorrectionConfig) -> bool:
    """Return True when ``algorithm.rollout_correction`` changes the update: IS weights,
    rejection sampling, the token veto or bypass mode."""
    return bool(
        config.rollout_is is not None
        or config.rollout_rs is not None
        or config.rollout_token_veto_threshold is not None
        or config.bypass_mode
    )


# ``DataProto.meta_info`` flag: the update computes the IS weights itself (``weights_in_update``).
IS_IN_UPDATE = "rollout_is_in_update"


def weights_in_update(config: RolloutCorrectionConfig) -> bool:
    """Return True when ``algorithm.rollout_correction`` is IS weights alone, each a function
    of its own token's or sequence's pi_old / pi_rollout: no rejection, no veto, no batch
    normalisation, not bypass mode. An update that sees the batch once in one mini-batch can
    then take pi_old from its own forward (the policy has not moved yet) and weigh each
    micro-batch as it goes, with no separate pi_old pass."""
    return bool(
        config.rollout_is is not None
        and config.rollout_rs is None
        and config.rollout_token_veto_threshold is None
        and not config.rollout_is_batch_normalize
        and not config.bypass_mode
    )


def compute_rollout_corr_metrics_from_logprobs(
    log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """Return :func:`compute_offpolicy_metrics` of the current policy against the rollout's,
    under ``rollout_corr/`` (verl's actor records them per micro-batch during the update)."""
    metrics = compute_offpolicy_metrics(log_prob.detach(), rollout_log_prob, response_mask)
    return {METRIC_PREFIX + key: value for key, value in metrics.items()}
