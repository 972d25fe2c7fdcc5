"""The names the algorithm registries accept, in one torch-free place.

``engine.config`` takes its choices from here, so the config accepts exactly what is registered.
The estimators' and the policy losses' names are read from their decorators in the source
(``engine.algorithms.registry.registered_names``, no import): to add one, register it beside its
peers and nothing here changes. The other lists are written here.
"""

from pathlib import Path
from typing import NamedTuple

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
# rollout_rs: verl 0.7's ratio levels, and the divergence options verl's main branch reads
# (verl PR #4544; a comma-separated list applies several): token, per-sequence sum, mean or max
# of the k1 (-log rho), k2 (0.5 log^2 rho) or k3 (rho - 1 - log rho) estimator.
ROLLOUT_RS_LEVELS = ("token", "sequence", "geometric")
ROLLOUT_RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)
BYPASS_LOSS_TYPES = ("ppo_clip", "reinforce")


class RejectionOption(NamedTuple):
    """One ``rollout_rs`` option with its bounds: ``lower`` only for the k1 options."""

    name: str
    lower: float | None
    upper: float


def is_divergence_rs(rollout_rs: str) -> bool:
    """Return True when ``rollout_rs`` names main's divergence options (not 0.7's levels)."""
    return any(part.strip() in ROLLOUT_RS_OPTIONS for part in rollout_rs.split(","))


def parse_rejection_options(
    rollout_rs: str, rollout_rs_threshold: float | str | None
) -> list[RejectionOption]:
    """Return the options of ``rollout_rs`` with their bounds, read as verl reads them.

    Duplicates are dropped; the threshold is a number or a string of one entry per option (one
    entry serves all), each ``"lower_upper"`` for a k1 option (one number ``u``: ``1/u`` to
    ``u``) or one positive upper bound for k2/k3. Raises ValueError naming the fix.
    """
    names = list(dict.fromkeys(part.strip() for part in rollout_rs.split(",") if part.strip()))
    if not names:
        raise ValueError("rollout_rs names no option; use one of " + ", ".join(ROLLOUT_RS_OPTIONS))
    unknown = [name for name in names if name not in ROLLOUT_RS_OPTIONS]
    if unknown:
        raise ValueError(
            f"rollout_rs option {unknown[0]!r} is not one of {', '.join(ROLLOUT_RS_OPTIONS)}"
        )
    if rollout_rs_threshold is None:
        raise ValueError("rollout_rs_threshold must be set for rejection sampling")
    if isinstance(rollout_rs_threshold, str):
        specs = [part.strip() for part in rollout_rs_threshold.split(",") if part.strip()]
    else:
        specs = [str(rollout_rs_threshold)]
    if len(specs) not in (1, len(names)):
        raise ValueError(
            f"rollout_rs_threshold gives {len(specs)} thresholds for {len(names)} rollout_rs "
            "options; give one for all or one per option, comma-separated"
        )
    specs = specs * len(names) if len(specs) == 1 else specs
    options = []
    for name, spec in zip(names, specs, strict=True):
        if name.endswith("k1"):
            lower_text, upper_text = spec.split("_", 1) if "_" in spec else ("", spec)
            try:
                upper = float(upper_text)
                lower = float(lower_text) if lower_text else 1.0 / upper
            except (ValueError, ZeroDivisionError):
                raise ValueError(
                    f"rollout_rs_threshold {spec!r} of {name} is not 'lower_upper' or one "
                    "positive number"
                ) from None
        else:
            try:
                if "_" in spec:
                    raise ValueError(spec)
                upper, lower = float(spec), None
            except ValueError:
                raise ValueError(
                    f"rollout_rs_threshold {spec!r} of {name} is not one number: k2 and k3 take "
                    "an upper bound only (no '_')"
                ) from None
        if upper <= 0 or (lower is not None and lower <= 0):
            raise ValueError(f"rollout_rs_threshold {spec!r} of {name} must be positive")
        options.append(RejectionOption(name, lower, upper))
    return options


# Per-token KL estimators (engine.algorithms.kl.kl_penalty); "+" takes k2's gradient instead.
KL_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "k3_unclamped")
KL_TYPES = (*KL_ESTIMATORS, *(f"{name}+" for name in KL_ESTIMATORS))
# algorithm.kl_ctrl.type: engine.algorithms.kl.get_kl_controller.
KL_CONTROLLER_TYPES = ("fixed", "adaptive", "pid")
