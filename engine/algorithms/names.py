"""The names the algorithm registries accept, in one torch-free place.

``engine.config.schema`` takes its choices from here, so the config accepts exactly what is
registered: ``register_adv_est`` and ``register_policy_loss`` refuse a name not listed here, and
the tests check that every listed name is registered. To add an estimator or a loss, list its
name here and register it beside its peers.
"""

# algorithm.adv_estimator: engine.algorithms.advantages' registry (verl's names).
ADV_ESTIMATORS = (
    "gae",
    "grpo",
    "rloo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "grpo_passk",
    "opo",
    "gpg",
    "grpo_vectorized",
    "rloo_vectorized",
    "optimal_token_baseline",
    "tir_optimal_token_baseline",
)
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

# actor.policy_loss.loss_mode: engine.algorithms.policy_loss' registry.
POLICY_LOSS_MODES = (
    "vanilla",
    "gspo",
    "gpg",
    "cispo",
    "clip_cov",
    "kl_cov",
    "sapo",
    "geo_mean",
    "bypass_mode",  # what algorithm.rollout_correction.bypass_mode=True trains with
)
# loss_agg_mode: how engine.algorithms.policy_loss.agg_loss averages token losses.
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
