"""The names the algorithm registries accept, in one torch-free place.

``engine.config`` takes its choices from here, so the config accepts exactly what is registered.
The estimators' and the policy losses' names are read from their decorators in the source
(``engine.algorithms.registry.registered_names``, no import): to add one, register it beside its
peers and nothing here changes. The other lists are written here.
"""

from pathlib import Path

from engine.algorithms.registry import registered_names

_HERE = Path(__file__).parent

# algorithm.adv_estimator: the @register_adv_est names of engine/algorithms/advantages.py (verl's).
ADV_ESTIMATORS = registered_names(_HERE / "advantages.py", "register_adv_est")
# Estimators whose baseline comes from the other samples of the same prompt.
GROUP_ESTIMATORS = (
    "grpo",
    "rloo",
    "grpo_passk",
    "opo",
    "reinforce_plus_plus_baseline",
    "gpg",
    "grpo_vectorized",
    "rloo_vectorized",
    "optimal_token_baseline",
    "tir_optimal_token_baseline",
)
# Estimators that need the policy's token probabilities: old_log_probs and sum_pi_squared.
TOKEN_BASELINE_ESTIMATORS = ("optimal_token_baseline", "tir_optimal_token_baseline")

# algorithm.pf_ppo.reweight_method: engine.algorithms.pf_ppo.pf_ppo_weights.
PF_PPO_REWEIGHT_METHODS = ("pow", "max_min", "max_random")

# actor.policy_loss.loss_mode: the @register_policy_loss names of engine/algorithms/policy_loss/.
POLICY_LOSS_MODES = registered_names(_HERE / "policy_loss", "register_policy_loss")
# loss_agg_mode: how engine.algorithms.loss_aggregation.agg_loss averages token losses.
LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)

# algorithm.rollout_correction: engine.algorithms.rollout_correction (verl's rollout_corr_helper).
ROLLOUT_IS_LEVELS = ("token", "sequence")
ROLLOUT_RS_LEVELS = ("token", "sequence", "geometric")
BYPASS_LOSS_TYPES = ("ppo_clip", "reinforce")

# Per-token KL estimators (engine.algorithms.kl.kl_penalty); "+" takes k2's gradient instead.
KL_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "k3_unclamped")
KL_TYPES = (*KL_ESTIMATORS, *(f"{name}+" for name in KL_ESTIMATORS))
# algorithm.kl_ctrl.type: engine.algorithms.kl.get_kl_controller.
KL_CONTROLLER_TYPES = ("fixed", "adaptive", "pid")
