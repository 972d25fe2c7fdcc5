"""From a step's scores to its advantages, the part of the step between scoring and updating.

In verl's order (``ray_trainer.py``): the token-level rewards (the scores, less the KL penalty to
the reference where ``algorithm.use_kl_in_reward``), the decoupled rollout correction (IS weights
for the loss, rejection in the mask the advantages and the update use), then the estimator that
``algorithm.adv_estimator`` names. Each function writes its tensors into the batch and returns
its metrics.
"""

from __future__ import annotations

import inspect

import torch

from engine.algorithms.advantages import get_adv_estimator_fn
from engine.algorithms.kl import KLController, apply_kl_penalty
from engine.algorithms.rollout_correction import (
    compute_rollout_correction_and_rejection_mask,
    correction_settings,
)
from engine.config import AlgorithmConfig
from engine.config.algorithm import RolloutCorrectionConfig
from engine.data import DataProto


def add_token_level_rewards(
    batch: DataProto, algorithm: AlgorithmConfig, kl_ctrl: KLController | None
) -> dict[str, float]:
    """Write ``token_level_rewards`` (bs, R): the scores, less the KL penalty where it applies."""
    b = batch.batch
    if not algorithm.use_kl_in_reward:
        b["token_level_rewards"] = b["token_level_scores"]
        return {}
    if kl_ctrl is None:
        raise ValueError("algorithm.use_kl_in_reward needs the KL controller it builds")
    # On-policy steps skip the old log-prob pass: the rollout's log-probs are the policy's.
    old_log_probs = b.get("old_log_probs", b["rollout_log_probs"])
    rewards, metrics = apply_kl_penalty(
        b["token_level_scores"],
        b["response_mask"],
        old_log_probs,
        b["ref_log_prob"],
        kl_ctrl,
        kl_penalty=algorithm.kl_penalty,
    )
    b["token_level_rewards"] = rewards
    return metrics


def add_rollout_correction(
    batch: DataProto, correction: RolloutCorrectionConfig
) -> dict[str, float]:
    """Write the rejection into ``response_mask`` and the IS weights into ``rollout_is_weights``.

    verl's ``compute_rollout_correction_and_add_to_batch``: pi_old (``old_log_probs``) against the
    rollout's own log-probs. The caller keeps the unrejected mask for the samples' records.
    """
    b = batch.batch
    weights, mask, metrics = compute_rollout_correction_and_rejection_mask(
        b["old_log_probs"],
        b["rollout_log_probs"],
        b["response_mask"],
        **correction_settings(correction),
    )
    b["response_mask"] = mask
    if weights is not None:
        b["rollout_is_weights"] = weights
    return metrics


def compute_advantage(
    batch: DataProto, algorithm: AlgorithmConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(advantages, returns)`` (bs, R) from the estimator named in the config.

    Each estimator takes the subset of the batch's tensors and hyper-parameters its signature
    names (verl's estimators differ: GAE wants values, GRPO the group index, ReMax baselines,
    the optimal token baselines the policy's token probabilities).
    """
    fn = get_adv_estimator_fn(algorithm.adv_estimator)
    b = batch.batch
    available = {
        "token_level_rewards": b["token_level_rewards"],
        "response_mask": b["response_mask"],
        "values": b.get("values"),
        "reward_baselines": b.get("reward_baselines"),
        "index": batch.non_tensor_batch["uid"],
        "gamma": algorithm.gamma,
        "lam": algorithm.lam,
        "norm_adv_by_std_in_grpo": algorithm.norm_adv_by_std_in_grpo,
        # On-policy steps skip the old log-prob pass: the rollout's are the policy's (verl's
        # bypass mode).
        "old_log_probs": b.get("old_log_probs", b.get("rollout_log_probs")),
        "sum_pi_squared": b.get("sum_pi_squared"),
        "rollout_is_weights": b.get("rollout_is_weights"),
    }
    params = inspect.signature(fn).parameters
    kwargs = {k: v for k, v in available.items() if k in params and v is not None}
    missing = [
        name
        for name, param in params.items()
        if param.default is inspect.Parameter.empty and name not in kwargs
    ]
    if missing:
        raise ValueError(
            f"algorithm.adv_estimator={algorithm.adv_estimator!r} needs {', '.join(missing)} "
            "in the batch and this step did not compute it; choose another estimator."
        )
    return fn(**kwargs)
