"""Policy losses, registered by ``actor.policy_loss.loss_mode`` as in verl's core_algos.

Every loss takes ``(old_log_prob, log_prob, advantages, response_mask)``, all
``(bs, response_length)``, then ``loss_agg_mode`` and keyword hyper-parameters named like the
actor config keys with verl's defaults. Every loss accepts the PPO clip keys (``clip_ratio``,
``clip_ratio_low``, ``clip_ratio_high``, ``clip_ratio_c``), so one call site serves all modes;
mode-specific keys (``clip_cov_*``, ``kl_cov_ratio``, ``ppo_kl_coef``, ``tau_pos``,
``tau_neg``) belong to their mode only. Every loss takes ``rollout_is_weights`` (bs, L), the
rollout correction's truncated importance weights (``engine.algorithms.rollout_correction``),
and multiplies its token losses by them as verl does (``geo_mean``: their per-sequence
geometric mean).
Each returns ``(pg_loss, metrics)``: a scalar tensor with its graph, and a dict of floats under
verl's metric names, holding only the metrics that mean something for that loss.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch

from engine.algorithms.names import LOSS_AGG_MODES, POLICY_LOSS_MODES
from engine.algorithms.registry import Registry
from engine.algorithms.torch_functional import check_same_shape, masked_mean, masked_sum

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]

POLICY_LOSS_REGISTRY: Registry[PolicyLossFn] = Registry(
    POLICY_LOSS_MODES,
    kind="policy loss mode",
    plural="loss modes",
    listed_as="engine.algorithms.names.POLICY_LOSS_MODES",
    source="engine/algorithms/policy_loss.py",
)
# verl's names. A name is given as a string literal: names.POLICY_LOSS_MODES reads it from here.
register_policy_loss = POLICY_LOSS_REGISTRY.register
get_policy_loss_fn = POLICY_LOSS_REGISTRY.lookup


@dataclass(frozen=True)
class GlobalBatch:
    """What a micro-batch's loss is normalised by: counts over the whole mini-batch.

    ``tokens``: valid (mask) tokens, and ``sequences``: rows with at least one valid token, summed
    over every micro-batch of the mini-batch and every data-parallel rank. ``dp_size``: the ranks
    whose gradients FSDP averages (the loss is multiplied by it, so the average is a sum).
    ``loss_scale_factor``: the constant divisor of ``seq-mean-token-sum-norm`` (verl 0.7's
    ``actor.loss_scale_factor``); None divides by the response length.
    """

    tokens: float
    sequences: float
    dp_size: int = 1
    loss_scale_factor: float | None = None


_GLOBAL_BATCH: ContextVar[GlobalBatch | None] = ContextVar("global_batch", default=None)


@contextmanager
def normalised_over(batch: GlobalBatch | None) -> Iterator[None]:
    """Make every :func:`agg_loss` call in the block normalise over ``batch`` (None: locally).

    The actor and critic wrap each micro-batch's loss in it, so every policy loss, registered
    now or later, aggregates over the mini-batch without a parameter of its own.
    """
    token = _GLOBAL_BATCH.set(batch)
    try:
        yield
    finally:
        _GLOBAL_BATCH.reset(token)


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

    ``global_batch`` (by default the one set by :func:`normalised_over`, else None) is verl 0.7's
    global aggregation (``core_algos.agg_loss`` with ``batch_num_tokens`` / ``global_batch_size``
    / ``dp_size``): ``tokens`` and ``sequences`` count the whole mini-batch over micro-batches and
    ranks, and the result is multiplied by ``dp_size``, so summing the micro-batches' gradients
    and averaging over ranks gives the gradient of the mini-batch's loss however it was split.
    ``seq-mean-token-sum-norm`` is multiplied by ``dp_size`` too (verl's FSDP engine leaves it
    out, so its gradient there shrinks with the rank count). Counts of zero divide by one.
    Without a global batch the counts are this micro-batch's own (``+ 1e-8``, as before).
    """
    check_same_shape(loss_mat=loss_mat, loss_mask=loss_mask)
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(
            f"Unknown loss_agg_mode {loss_agg_mode!r}; valid modes are: {', '.join(LOSS_AGG_MODES)}."
        )
    batch = global_batch if global_batch is not None else _GLOBAL_BATCH.get()
    dp_size = batch.dp_size if batch is not None else 1
    if loss_agg_mode == "token-mean":
        if batch is None:
            return masked_mean(loss_mat, loss_mask)
        return masked_sum(loss_mat, loss_mask) / max(batch.tokens, 1) * dp_size
    seq_losses = masked_sum(loss_mat, loss_mask, axis=-1)  # (bs,) token sums
    if loss_agg_mode == "seq-mean-token-sum-norm":
        scale = batch.loss_scale_factor if batch is not None else None
        return seq_losses.sum() / (scale or loss_mask.shape[-1]) * dp_size
    seq_tokens = loss_mask.sum(dim=-1)  # (bs,)
    seq_valid = (seq_tokens > 0).to(loss_mat.dtype)  # (bs,) sequences with any valid token
    if loss_agg_mode == "seq-mean-token-mean":
        seq_losses = seq_losses / (seq_tokens + 1e-8)  # (bs,) token means
    if batch is None:
        return masked_mean(seq_losses, seq_valid)
    return masked_sum(seq_losses, seq_valid) / max(batch.sequences, 1) * dp_size


def _clip_range(
    clip_ratio: float, clip_ratio_low: float | None, clip_ratio_high: float | None
) -> tuple[float, float]:
    """Return ``(low, high)``, each falling back to ``clip_ratio`` when None."""
    low = clip_ratio if clip_ratio_low is None else clip_ratio_low
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    return low, high


def _check_inputs(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
) -> None:
    """Raise ValueError unless the four ``(bs, L)`` inputs of a policy loss share one shape."""
    check_same_shape(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
    )


def _weighted(pg_losses: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    """Return the ``(bs, L)`` token losses times the rollout-correction IS weights, if any."""
    return pg_losses if rollout_is_weights is None else pg_losses * rollout_is_weights


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Return PPO's clipped surrogate loss with dual clip, and its clip metrics.

    PPO, Schulman et al., arXiv 1707.06347; dual clip, Ye et al., arXiv 1912.09729.
    ``r = exp(clamp(logp - old_logp, -20, 20))``; ``L = max(-A r, -A clamp(r, 1-low, 1+high))``;
    for ``A < 0`` also ``min(L, -A * clip_ratio_c)``. Metrics: ``actor/pg_clipfrac`` (share of
    tokens where the clip bites), ``actor/ppo_kl`` (mean ``old_logp - logp``),
    ``actor/pg_clipfrac_lower`` (share where the dual clip bites). Shapes: all ``(bs, L)``.
    """
    _check_inputs(old_log_prob, log_prob, advantages, response_mask)
    if clip_ratio_c <= 1.0:
        raise ValueError(
            f"clip_ratio_c must be greater than 1.0 for the dual clip, got {clip_ratio_c}; "
            "the default is 3.0."
        )
    low, high = _clip_range(clip_ratio, clip_ratio_low, clip_ratio_high)
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)  # (bs, L)
    ratio = torch.exp(negative_approx_kl)  # (bs, L)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)

    pg_losses1 = -advantages * ratio  # (bs, L)
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - low, 1 + high)  # (bs, L)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)

    pg_losses3 = -advantages * clip_ratio_c  # (bs, L)
    clip_pg_losses2 = torch.minimum(pg_losses3, clip_pg_losses1)
    negative = advantages < 0
    pg_clipfrac_lower = masked_mean(
        (torch.gt(clip_pg_losses1, pg_losses3) & negative).float(), response_mask
    )
    pg_losses = torch.where(negative, clip_pg_losses2, clip_pg_losses1)  # (bs, L)
    pg_losses = _weighted(pg_losses, rollout_is_weights)  # (bs, L)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    return pg_loss, {
        "actor/pg_clipfrac": pg_clipfrac.item(),
        "actor/ppo_kl": ppo_kl.item(),
        "actor/pg_clipfrac_lower": pg_clipfrac_lower.item(),
    }


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = 3e-4,
    clip_ratio_high: float | None = 4e-4,
    clip_ratio_c: float = 3.0,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Return GSPO's loss, clipping a sequence-level importance ratio.

    Group Sequence Policy Optimization, Zheng et al., arXiv 2507.18071.
    ``s_i = exp(mean_t(logp - old_logp))`` over the valid tokens of sequence i; each token uses
    ``s_it = sg[s_i] * p_t / sg[p_t]`` (log-space, clamped at 10), whose value is ``s_i`` and
    whose gradient is the token's. ``L = max(-A s_it, -A clamp(s_it, 1-low, 1+high))``; the
    paper's ranges 3e-4 / 4e-4 are the defaults, None falls back to ``clip_ratio``.
    ``clip_ratio_c`` is accepted for a uniform call site and unused. Metrics:
    ``actor/pg_clipfrac``, ``actor/ppo_kl``. Shapes: all ``(bs, L)``.
    """
    _check_inputs(old_log_prob, log_prob, advantages, response_mask)
    low, high = _clip_range(clip_ratio, clip_ratio_low, clip_ratio_high)
    negative_approx_kl = log_prob - old_log_prob  # (bs, L)
    mask = response_mask.to(log_prob.dtype)
    seq_lengths = mask.sum(dim=-1).clamp(min=1)  # (bs,)
    seq_log_ratio = masked_sum(negative_approx_kl, mask, axis=-1) / seq_lengths  # (bs,)
    log_token_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    seq_importance_ratio = torch.exp(torch.clamp(log_token_ratio, max=10.0))  # (bs, L)

    pg_losses1 = -advantages * seq_importance_ratio
    pg_losses2 = -advantages * torch.clamp(seq_importance_ratio, 1 - low, 1 + high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)  # (bs, L)
    pg_losses = _weighted(pg_losses, rollout_is_weights)  # (bs, L)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)
    return pg_loss, {"actor/pg_clipfrac": pg_clipfrac.item(), "actor/ppo_kl": ppo_kl.item()}


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Return GPG's plain policy-gradient loss ``-logp * A``, with no ratio and no clip.

    Group Policy Gradient, Chu et al., arXiv 2504.02546. ``old_log_prob`` and the clip keys are
    accepted for a uniform call site and unused; no metrics apply. Shapes: all ``(bs, L)``.
    """
    _check_inputs(old_log_prob, log_prob, advantages, response_mask)
    pg_losses = -log_prob * advantages  # (bs, L)
    pg_losses = _weighted(pg_losses, rollout_is_weights)  # (bs, L)
    return agg_loss(pg_losses, response_mask, loss_agg_mode), {}


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Return CISPO's loss ``-sg[clamp(r, 1-low, 1+high)] * A * logp``.

    Clipped IS-weight Policy Optimization, MiniMax-M1, arXiv 2506.13585: the importance weight
    is clipped and detached instead of the update, so every token keeps a gradient.
    ``r = exp(clamp(logp - old_logp, -20, 20))``. ``clip_ratio_c`` is unused. Metrics:
    ``actor/pg_clipfrac`` (share of tokens whose weight was clipped), ``actor/ppo_kl``.
    Shapes: all ``(bs, L)``.
    """
    _check_inputs(old_log_prob, log_prob, advantages, response_mask)
    low, high = _clip_range(clip_ratio, clip_ratio_low, clip_ratio_high)
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)  # (bs, L)
    ratio = torch.exp(negative_approx_kl)  # (bs, L)
    clipped_ratio = torch.clamp(ratio, 1 - low, 1 + high).detach()  # (bs, L)
    pg_losses = -advantages * clipped_ratio * log_prob  # (bs, L)
    pg_losses = _weighted(pg_losses, rollout_is_weights)  # (bs, L)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    clipped = ((ratio < 1 - low) | (ratio > 1 + high)).float()
    pg_clipfrac = masked_mean(clipped, response_mask)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)
    return pg_loss, {"actor/pg_clipfrac": pg_clipfrac.item(), "actor/ppo_kl": ppo_kl.item()}


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    clip_cov_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Return the Clip-Cov loss: PPO's clipped loss with high-covariance tokens detached.

    Clip-Cov, Cui et al., "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617.
    Per token ``cov = (A - mean(A)) * (logp - mean(logp))`` (masked means); among valid tokens
    not already clipped by PPO with ``clip_cov_lb < cov < clip_cov_ub``, a random
    ``max(1, int(clip_cov_ratio * #valid))`` get zero loss (and gradient). The draw uses torch's
    global generator, as verl does. ``clip_ratio_c`` is unused (no dual clip). Metrics:
    ``actor/pg_clipfrac`` (share of detached tokens), ``actor/ppo_kl``. Shapes: all ``(bs, L)``.
    """
    _check_inputs(old_log_prob, log_prob, advantages, response_mask)
    if clip_cov_ratio <= 0:
        raise ValueError(f"clip_cov_ratio must be greater than 0, got {clip_cov_ratio}.")
    low, high = _clip_range(clip_ratio, clip_ratio_low, clip_ratio_high)
    negative_approx_kl = log_prob - old_log_prob  # (bs, L)
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)
    pg_losses1 = -advantages * ratio  # (bs, L)
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - low, 1 + high)  # (bs, L)

    with torch.no_grad():
        valid = response_mask > 0  # (bs, L)
        cov = (advantages - masked_mean(advantages, response_mask)) * (
            log_prob - masked_mean(log_prob, response_mask)
        )  # (bs, L)
        candidates = valid & ~(pg_losses2 > pg_losses1) & (cov > clip_cov_lb) & (cov < clip_cov_ub)
        candidate_idx = torch.nonzero(candidates)  # (n, 2)
        clip_num = max(int(clip_cov_ratio * response_mask.sum().item()), 1)
        chosen = candidate_idx[torch.randperm(len(candidate_idx))[:clip_num]]
        corr = torch.ones_like(advantages)  # (bs, L)
        corr[chosen[:, 0], chosen[:, 1]] = 0
    pg_clipfrac = masked_mean((corr == 0).float(), response_mask)
    pg_losses = torch.maximum(pg_losses1, pg_losses2) * corr  # (bs, L)
    pg_losses = _weighted(pg_losses, rollout_is_weights)  # (bs, L)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    return pg_loss, {"actor/pg_clipfrac": pg_clipfrac.item(), "actor/ppo_kl": ppo_kl.item()}


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    kl_cov_ratio: float = 0.0002,
    ppo_kl_coef: float = 0.1,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Return the KL-Cov loss: the unclipped surrogate plus a KL penalty on top-covariance tokens.

    KL-Cov, Cui et al., arXiv 2505.22617. ``L = -A r`` with ``r = exp(logp - old_logp)``; the
    ``max(1, int(kl_cov_ratio * #valid))`` valid tokens with the largest
    ``(A - mean A) * (logp - mean logp)`` get ``-A r + ppo_kl_coef * |logp - old_logp|``.
    The clip keys are unused. Metric: ``actor/ppo_kl`` (mean absolute log-ratio, as verl
    reports for this mode). Shapes: all ``(bs, L)``.
    """
    _check_inputs(old_log_prob, log_prob, advantages, response_mask)
    if kl_cov_ratio <= 0:
        raise ValueError(f"kl_cov_ratio must be greater than 0, got {kl_cov_ratio}.")
    negative_approx_kl = log_prob - old_log_prob  # (bs, L)
    abs_kl = negative_approx_kl.abs()
    ratio = torch.exp(negative_approx_kl)
    ppo_kl_abs = masked_mean(abs_kl, response_mask)
    pg_losses1 = -advantages * ratio  # (bs, L)
    pg_losses_kl = pg_losses1 + ppo_kl_coef * abs_kl  # (bs, L)

    with torch.no_grad():
        valid = response_mask > 0  # (bs, L)
        penalised = torch.zeros(valid.shape, dtype=torch.bool, device=valid.device)  # (bs, L)
        valid_idx = torch.nonzero(valid.reshape(-1)).squeeze(-1)  # (n,)
        if valid_idx.numel() > 0:
            adv = advantages.reshape(-1)[valid_idx]  # (n,)
            logp = log_prob.detach().reshape(-1)[valid_idx]  # (n,)
            cov = (adv - adv.mean()) * (logp - logp.mean())  # (n,)
            k = max(1, int(valid_idx.numel() * kl_cov_ratio))
            top = valid_idx[torch.topk(cov, k, largest=True).indices]
            penalised.view(-1)[top] = True
    pg_losses = torch.where(penalised, pg_losses_kl, pg_losses1)  # (bs, L)
    pg_losses = _weighted(pg_losses, rollout_is_weights)  # (bs, L)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    return pg_loss, {"actor/ppo_kl": ppo_kl_abs.item()}


@register_policy_loss("sapo")
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Return SAPO's loss, a smooth sigmoid gate on the ratio in place of the hard clip.

    Soft Adaptive Policy Optimization, Gao et al., arXiv 2511.20347.
    ``r = exp(clamp(logp - old_logp, -20, 20))``; ``tau = tau_pos`` where ``A > 0``, else
    ``tau_neg``; ``f(r) = sigmoid(tau (r - 1)) * 4 / tau`` (slope 1 at ``r = 1``, so on-policy
    its gradient is the policy gradient's, fading as ``r`` moves away); ``L = -f(r) A``. The
    paper's defaults ``tau_pos = 1.0``, ``tau_neg = 1.05`` damp negative updates harder.
    The objective is a mean over sequences of token means, so the loss always aggregates with
    ``seq-mean-token-mean`` whatever ``loss_agg_mode`` says, as verl does. The clip keys are
    unused. Metric: ``actor/ppo_kl``. Shapes: all ``(bs, L)``.
    """
    _check_inputs(old_log_prob, log_prob, advantages, response_mask)
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(
            f"tau_pos and tau_neg must be greater than 0, got {tau_pos} and {tau_neg}; "
            "the paper's defaults are 1.0 and 1.05."
        )
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)  # (bs, L)
    ratio = torch.exp(negative_approx_kl)  # (bs, L)
    taus = torch.where(advantages > 0, tau_pos, tau_neg).to(ratio.dtype)  # (bs, L)
    gates = torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus)  # (bs, L) f(r)
    pg_losses = -gates * advantages  # (bs, L)
    pg_losses = _weighted(pg_losses, rollout_is_weights)  # (bs, L)
    pg_loss = agg_loss(pg_losses, response_mask, "seq-mean-token-mean")
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)
    return pg_loss, {"actor/ppo_kl": ppo_kl.item()}


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Return GMPO's loss, which weights each sequence by the geometric mean of its ratios.

    Geometric-Mean Policy Optimization, Zhao et al., arXiv 2507.20673. Per token the log-ratio
    ``d = logp - old_logp`` is clipped in log space, on the side the advantage's sign pushes:
    ``d' = sign(A) min(sign(A) d, sign(A) clamp(d, -low, high))``. Per sequence,
    ``R_i = exp(mean_t d')`` and ``A_i = mean_t A`` over its valid tokens (sequence-level
    advantages, as the paper assumes); ``L_i = -A_i R_i``, averaged over the sequences that
    hold a valid token (through :func:`agg_loss`, so over the mini-batch's sequences in the
    trainer); ``loss_agg_mode`` does not apply. ``clip_ratio_c`` is unused. Metrics:
    ``actor/pg_clipfrac`` (share of tokens clipped with ``A > 0``), ``actor/pg_clipfrac_lower``
    (with ``A < 0``), ``actor/ppo_kl``. Shapes: inputs ``(bs, L)``.
    """
    _check_inputs(old_log_prob, log_prob, advantages, response_mask)
    low, high = _clip_range(clip_ratio, clip_ratio_low, clip_ratio_high)
    negative_approx_kl = log_prob - old_log_prob  # (bs, L)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)
    sign = torch.sign(advantages)  # (bs, L)
    clamped = torch.clamp(negative_approx_kl, -low, high)  # (bs, L)
    clipped_log_ratio = sign * torch.minimum(sign * negative_approx_kl, sign * clamped)  # (bs, L)

    seq_tokens = response_mask.sum(dim=-1) + 1e-8  # (bs,)
    seq_ratio = torch.exp(masked_sum(clipped_log_ratio, response_mask, axis=-1) / seq_tokens)
    seq_advantage = masked_sum(advantages, response_mask, axis=-1) / seq_tokens  # (bs,)
    seq_losses = (-seq_advantage * seq_ratio).unsqueeze(-1)  # (bs, 1)
    seq_valid = (response_mask.sum(dim=-1, keepdim=True) > 0).to(seq_losses.dtype)  # (bs, 1)
    if rollout_is_weights is not None:  # (bs, L) -> (bs, 1): their geometric mean per sequence
        log_weights = masked_sum(torch.log(rollout_is_weights + 1e-10), response_mask, axis=-1)
        seq_losses = seq_losses * torch.exp(log_weights / seq_tokens).unsqueeze(-1)
    pg_loss = agg_loss(seq_losses, seq_valid, "seq-mean-token-sum")

    clipped = torch.ne(negative_approx_kl, clamped)  # (bs, L)
    pg_clipfrac = masked_mean((clipped & (advantages > 0)).float(), response_mask)
    pg_clipfrac_lower = masked_mean((clipped & (advantages < 0)).float(), response_mask)
    return pg_loss, {
        "actor/pg_clipfrac": pg_clipfrac.item(),
        "actor/ppo_kl": ppo_kl.item(),
        "actor/pg_clipfrac_lower": pg_clipfrac_lower.item(),
    }


@register_policy_loss("bypass_mode")
def compute_policy_loss_bypass_mode(
    *args: Any, rollout_correction: Any = None, **kwargs: Any
) -> tuple[torch.Tensor, dict]:
    """verl's ``bypass_mode`` loss: the rollout's log-probs as the old policy's, with the
    corrections of ``rollout_correction`` (the config section; None: verl's defaults, PPO's
    clipped loss and no correction). It lives with them in ``engine.algorithms.rollout_correction``.
    """
    from engine.algorithms.rollout_correction import compute_policy_loss_bypass_mode as loss

    if rollout_correction is None:
        rollout_correction = dict(BYPASS_DEFAULTS)
    return loss(*args, rollout_correction=rollout_correction, **kwargs)


# verl's algorithm.rollout_correction defaults with bypass mode on.
BYPASS_DEFAULTS = {
    "rollout_is": None,
    "rollout_is_threshold": 2.0,
    "rollout_rs": None,
    "rollout_rs_threshold": None,
    "rollout_rs_threshold_lower": None,
    "rollout_token_veto_threshold": None,
    "bypass_mode": True,
    "loss_type": "ppo_clip",
    "rollout_is_batch_normalize": False,
}
