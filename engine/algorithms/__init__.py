"""PostTrain Studio's RL algorithm library: verl's core_algos and torch_functional, as pure
tensor functions under verl's names.

Advantage estimators are looked up with ``get_adv_estimator_fn(algorithm.adv_estimator)``,
policy losses with ``get_policy_loss_fn(actor.policy_loss.loss_mode)`` and KL controllers with
``get_kl_controller(algorithm.kl_ctrl)``. Nothing here knows about models, workers or Ray.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from engine.algorithms.names import (
    ADV_ESTIMATORS,
    GROUP_ESTIMATORS,
    KL_CONTROLLER_TYPES,
    KL_ESTIMATORS,
    KL_TYPES,
    LOSS_AGG_MODES,
    PF_PPO_REWEIGHT_METHODS,
    POLICY_LOSS_MODES,
    TOKEN_BASELINE_ESTIMATORS,
)

if TYPE_CHECKING:
    from engine.algorithms.advantages import (
        ADV_ESTIMATOR_REGISTRY,
        AdvantageEstimator,
        compute_gae_advantage_return,
        compute_gpg_outcome_advantage,
        compute_grpo_outcome_advantage,
        compute_grpo_passk_outcome_advantage,
        compute_grpo_vectorized_outcome_advantage,
        compute_multi_turn_optimal_token_baseline_advantage,
        compute_opo_outcome_advantage,
        compute_optimal_token_baseline_advantage,
        compute_reinforce_plus_plus_baseline_outcome_advantage,
        compute_reinforce_plus_plus_outcome_advantage,
        compute_remax_outcome_advantage,
        compute_rloo_outcome_advantage,
        compute_rloo_vectorized_outcome_advantage,
        get_adv_estimator_fn,
        register_adv_est,
    )
    from engine.algorithms.kl import (
        AdaptiveKLController,
        FixedKLController,
        PIDKLController,
        apply_kl_penalty,
        compute_rewards,
        get_kl_controller,
        kl_penalty,
    )
    from engine.algorithms.pf_ppo import (
        compute_pf_ppo_reweight_data,
        pf_ppo_sample_indices,
        pf_ppo_weights,
    )
    from engine.algorithms.policy_loss import (
        POLICY_LOSS_REGISTRY,
        agg_loss,
        compute_policy_loss_cispo,
        compute_policy_loss_clip_cov,
        compute_policy_loss_gpg,
        compute_policy_loss_gspo,
        compute_policy_loss_kl_cov,
        compute_policy_loss_vanilla,
        get_policy_loss_fn,
        register_policy_loss,
    )
    from engine.algorithms.torch_functional import (
        check_same_shape,
        clip_by_value,
        entropy_from_logits,
        logprobs_from_logits,
        mask_span_end,
        masked_mean,
        masked_sum,
        masked_var,
        masked_whiten,
    )
    from engine.algorithms.value import compute_entropy_loss, compute_value_loss

# Imported on first access (PEP 562): the name lists above need no torch, so the config schema
# can import engine.algorithms.names without loading torch through this package.
_LAZY = {
    "ADV_ESTIMATOR_REGISTRY": "engine.algorithms.advantages",
    "AdvantageEstimator": "engine.algorithms.advantages",
    "compute_gae_advantage_return": "engine.algorithms.advantages",
    "compute_gpg_outcome_advantage": "engine.algorithms.advantages",
    "compute_grpo_outcome_advantage": "engine.algorithms.advantages",
    "compute_grpo_passk_outcome_advantage": "engine.algorithms.advantages",
    "compute_grpo_vectorized_outcome_advantage": "engine.algorithms.advantages",
    "compute_multi_turn_optimal_token_baseline_advantage": "engine.algorithms.advantages",
    "compute_opo_outcome_advantage": "engine.algorithms.advantages",
    "compute_optimal_token_baseline_advantage": "engine.algorithms.advantages",
    "compute_reinforce_plus_plus_baseline_outcome_advantage": "engine.algorithms.advantages",
    "compute_reinforce_plus_plus_outcome_advantage": "engine.algorithms.advantages",
    "compute_remax_outcome_advantage": "engine.algorithms.advantages",
    "compute_rloo_outcome_advantage": "engine.algorithms.advantages",
    "compute_rloo_vectorized_outcome_advantage": "engine.algorithms.advantages",
    "get_adv_estimator_fn": "engine.algorithms.advantages",
    "register_adv_est": "engine.algorithms.advantages",
    "AdaptiveKLController": "engine.algorithms.kl",
    "FixedKLController": "engine.algorithms.kl",
    "PIDKLController": "engine.algorithms.kl",
    "apply_kl_penalty": "engine.algorithms.kl",
    "compute_rewards": "engine.algorithms.kl",
    "get_kl_controller": "engine.algorithms.kl",
    "kl_penalty": "engine.algorithms.kl",
    "compute_pf_ppo_reweight_data": "engine.algorithms.pf_ppo",
    "pf_ppo_sample_indices": "engine.algorithms.pf_ppo",
    "pf_ppo_weights": "engine.algorithms.pf_ppo",
    "POLICY_LOSS_REGISTRY": "engine.algorithms.policy_loss",
    "agg_loss": "engine.algorithms.policy_loss",
    "compute_policy_loss_cispo": "engine.algorithms.policy_loss",
    "compute_policy_loss_clip_cov": "engine.algorithms.policy_loss",
    "compute_policy_loss_gpg": "engine.algorithms.policy_loss",
    "compute_policy_loss_gspo": "engine.algorithms.policy_loss",
    "compute_policy_loss_kl_cov": "engine.algorithms.policy_loss",
    "compute_policy_loss_vanilla": "engine.algorithms.policy_loss",
    "get_policy_loss_fn": "engine.algorithms.policy_loss",
    "register_policy_loss": "engine.algorithms.policy_loss",
    "check_same_shape": "engine.algorithms.torch_functional",
    "clip_by_value": "engine.algorithms.torch_functional",
    "entropy_from_logits": "engine.algorithms.torch_functional",
    "logprobs_from_logits": "engine.algorithms.torch_functional",
    "mask_span_end": "engine.algorithms.torch_functional",
    "masked_mean": "engine.algorithms.torch_functional",
    "masked_sum": "engine.algorithms.torch_functional",
    "masked_var": "engine.algorithms.torch_functional",
    "masked_whiten": "engine.algorithms.torch_functional",
    "compute_entropy_loss": "engine.algorithms.value",
    "compute_value_loss": "engine.algorithms.value",
}

__all__ = [
    "ADV_ESTIMATORS",
    "GROUP_ESTIMATORS",
    "KL_CONTROLLER_TYPES",
    "KL_ESTIMATORS",
    "KL_TYPES",
    "PF_PPO_REWEIGHT_METHODS",
    "POLICY_LOSS_MODES",
    "TOKEN_BASELINE_ESTIMATORS",
    "mask_span_end",
    "ADV_ESTIMATOR_REGISTRY",
    "LOSS_AGG_MODES",
    "POLICY_LOSS_REGISTRY",
    "AdaptiveKLController",
    "AdvantageEstimator",
    "FixedKLController",
    "PIDKLController",
    "agg_loss",
    "apply_kl_penalty",
    "check_same_shape",
    "clip_by_value",
    "compute_entropy_loss",
    "compute_gae_advantage_return",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_multi_turn_optimal_token_baseline_advantage",
    "compute_opo_outcome_advantage",
    "compute_optimal_token_baseline_advantage",
    "compute_pf_ppo_reweight_data",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rewards",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "compute_value_loss",
    "entropy_from_logits",
    "get_adv_estimator_fn",
    "get_kl_controller",
    "get_policy_loss_fn",
    "kl_penalty",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "pf_ppo_sample_indices",
    "pf_ppo_weights",
    "register_adv_est",
    "register_policy_loss",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'engine.algorithms' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
