"""``algorithm``: the advantage estimator, the KL in the reward, PF-PPO, rollout correction and
DAPO's group filtering.

verl's ``AlgoConfig`` (``verl/trainer/config/algorithm.py``). The rules are at the end: the KL
controller, rollout correction's keys together and against the estimator and the policy loss, and
DAPO's group filtering against the rewards; a KL term counted twice or missing is a warning.
"""

from dataclasses import dataclass

from engine.algorithms.names import (
    ADV_ESTIMATORS,
    BYPASS_LOSS_TYPES,
    KL_CONTROLLER_TYPES,
    KL_TYPES,
    PF_PPO_REWEIGHT_METHODS,
    ROLLOUT_IS_LEVELS,
    ROLLOUT_RS_LEVELS,
    ROLLOUT_RS_OPTIONS,
    TOKEN_BASELINE_ESTIMATORS,
    parse_rejection_options,
)
from engine.config.fields import (
    MAX_STEPS,
    ConfigFieldError,
    Validation,
    _f,
    _Section,
    _section,
    _target,
)


@dataclass
class RolloutCorrectionConfig(_Section):
    """verl's rollout correction between the trainer's and the rollout's log-probs
    (``engine.algorithms.rollout_correction``; docs/validation-and-checkpoints.md)."""

    rollout_is: str | None = _f(
        None,
        "Truncated importance-sampling weights pi_old / pi_rollout on the policy loss: token "
        "(per token) or sequence (product over the response); null: none. Makes the trainer "
        "recompute the old log-probs unless bypass_mode.",
        choices=ROLLOUT_IS_LEVELS,
    )
    rollout_is_threshold: float = _f(
        2.0,
        "Upper truncation of the IS weights (typical 1.5-5 per token, 2-10 per sequence).",
        gt=0,
    )
    rollout_rs: str | None = _f(
        None,
        "Rejection sampling; null: none. verl main's divergence options, comma-separated, all "
        f"of which must pass: {', '.join(ROLLOUT_RS_OPTIONS)} (token, or per response the sum, "
        "mean or max of k1 = -log ratio, k2 = log^2 ratio / 2, k3 = ratio - 1 - log ratio). "
        "verl 0.7's levels: token, sequence (product of ratios) or geometric (their geometric "
        "mean) outside [rollout_rs_threshold_lower, rollout_rs_threshold].",
    )
    rollout_rs_threshold: str | float | None = _f(
        None,
        "Bound(s) of rejection sampling; required when rollout_rs is set. Main's options: one "
        "entry for all or one per option, comma-separated; a k1 option takes 'lower_upper' "
        "(one number u: 1/u_u), k2 and k3 an upper bound. 0.7's levels: the upper ratio.",
    )
    rollout_rs_threshold_lower: float | None = _f(
        None,
        "Lower ratio of verl 0.7's rejection levels; null: 1 / rollout_rs_threshold. Removed in "
        "verl main: write rollout_rs=token_k1 (or seq_sum_k1, seq_mean_k1) with "
        "rollout_rs_threshold='1/upper_1/lower' (k1 is -log ratio).",
        gt=0,
    )
    rollout_token_veto_threshold: float | None = _f(
        None,
        "Mask out a whole response holding a token whose ratio is under this (e.g. 1e-4); "
        "null: off. verl 0.7's; removed in verl main.",
        gt=0,
    )
    bypass_mode: bool = _f(
        False,
        "Use the rollout's log-probs as the old policy's and skip the old-log-prob forward pass; "
        "the corrections then compare the current policy with the rollout's, inside the loss.",
    )
    loss_type: str = _f(
        "ppo_clip",
        "Loss of bypass mode: ppo_clip (PPO's clipped ratio to the rollout policy, no IS "
        "weights) or reinforce (REINFORCE times the IS weights).",
        choices=BYPASS_LOSS_TYPES,
    )
    rollout_is_batch_normalize: bool = _f(
        False, "Divide the truncated IS weights by their batch mean (mean 1)."
    )


@dataclass
class KLControlConfig(_Section):
    type: str = _f("fixed", "KL coefficient controller.", choices=KL_CONTROLLER_TYPES)
    kl_coef: float = _f(0.001, "(Initial) coefficient of KL in the reward.", basic=True, ge=0)
    horizon: int = _f(10000, "adaptive: steps over which the coefficient adapts.", le=MAX_STEPS)
    target_kl: float = _f(0.1, "adaptive/pid: KL the controller aims for.")
    kp: float = _f(0.1, "pid: proportional gain on (kl - target_kl).")
    ki: float = _f(0.01, "pid: integral gain.")
    kd: float = _f(0.0, "pid: derivative gain.")
    _target_: str = _target("verl.trainer.config.KLControlConfig")


@dataclass
class PFPPOConfig(_Section):
    reweight_method: str = _f(
        "pow",
        "How a response's score weighs its chance to be drawn: pow |s|^weight_pow, max_min "
        "(only the batch's best and worst), max_random (best 0.4, others 0.1).",
        choices=PF_PPO_REWEIGHT_METHODS,
    )
    weight_pow: float = _f(2.0, "pow: the exponent of |score|.", ge=0)


@dataclass
class FilterGroupsConfig(_Section):
    _target_: str = _target("verl.trainer.config.FilterGroupsConfig")
    enable: bool = _f(
        False,
        "DAPO's dynamic sampling: drop each prompt's group whose metric is the same for every "
        "response (zero advantage), generate more batches of data.gen_batch_size prompts until "
        "data.train_batch_size groups are kept, and train on exactly that many.",
    )
    metric: str | None = _f(
        None,
        "What a kept group must vary in: acc, score (the reward function's score), seq_reward "
        "(the reward summed over tokens, overlong penalty included), seq_final_reward (after the "
        "KL in the reward), or another key the reward function returns.",
    )
    max_num_gen_batches: int = _f(
        0,
        "Generation batches one step may use before it fails; <= 0: no limit.",
        le=MAX_STEPS,
    )


@dataclass
class AlgorithmConfig(_Section):
    gamma: float = _f(1.0, "Discount factor.", ge=0, le=1)
    lam: float = _f(1.0, "GAE lambda.", ge=0, le=1)
    adv_estimator: str = _f("gae", "Advantage estimator.", choices=ADV_ESTIMATORS, basic=True)
    norm_adv_by_std_in_grpo: bool = _f(True, "Divide GRPO advantages by the group std.")
    use_kl_in_reward: bool = _f(False, "Subtract a KL penalty from the reward (PPO).", basic=True)
    kl_penalty: str = _f("kl", "KL estimator of the reward penalty.", choices=KL_TYPES)
    kl_ctrl: KLControlConfig = _section(KLControlConfig, "KL-in-reward coefficient control.")
    allow_single_sample_groups: bool = _f(False, "Let group estimators run with rollout.n=1.")
    use_pf_ppo: bool = _f(
        False,
        "PF-PPO (arXiv 2409.06957): update on the batch resampled, with replacement, by weights "
        "of the responses' scores.",
    )
    pf_ppo: PFPPOConfig = _section(PFPPOConfig, "PF-PPO's resampling weights.")
    rollout_correction: RolloutCorrectionConfig = _section(
        RolloutCorrectionConfig, "Correction for the rollout's own probabilities."
    )
    filter_groups: FilterGroupsConfig = _section(
        FilterGroupsConfig, "DAPO's dynamic sampling (group filtering)."
    )
    _target_: str = _target("verl.trainer.config.AlgoConfig")


def algorithm_problems(v: Validation) -> list[ConfigFieldError]:
    """Return the errors of the algorithm's keys: the KL controller, rollout correction and DAPO's
    group filtering; warn when the KL to the reference is counted twice, or not at all in GRPO."""
    cfg = v.cfg
    algo: AlgorithmConfig = cfg.algorithm
    actor = cfg.actor_rollout_ref.actor
    estimator, errors = algo.adv_estimator, []
    if estimator in TOKEN_BASELINE_ESTIMATORS and algo.rollout_correction.bypass_mode:
        # Their sum_pi_squared comes from the old-log-prob pass, which bypass mode skips (verl
        # fails there at its first step, asserting sum_pi_squared is in the batch).
        errors.append(
            ConfigFieldError(
                "algorithm.rollout_correction.bypass_mode",
                True,
                f"{estimator} weighs by each token's sum of squared probabilities, which the "
                "old-log-prob pass computes and bypass mode skips; set bypass_mode=False "
                "(decoupled correction) or choose another estimator such as grpo",
            )
        )
    if algo.use_kl_in_reward and actor.use_kl_loss:
        v.warnings.append(
            "both algorithm.use_kl_in_reward and actor_rollout_ref.actor.use_kl_loss are on: "
            "the KL to the reference is penalised twice"
        )
    if estimator == "grpo" and not (algo.use_kl_in_reward or actor.use_kl_loss):
        v.warnings.append(
            "GRPO without a KL term: nothing keeps the policy near the reference; set "
            "actor_rollout_ref.actor.use_kl_loss=True (kl_loss_coef=0.001, as verl's examples)"
        )
    kl_ctrl = algo.kl_ctrl
    if kl_ctrl.type in ("adaptive", "pid") and kl_ctrl.target_kl <= 0:
        errors.append(
            ConfigFieldError(
                "algorithm.kl_ctrl.target_kl",
                kl_ctrl.target_kl,
                f"must be > 0 for kl_ctrl.type={kl_ctrl.type}",
            )
        )
    if kl_ctrl.type == "adaptive" and kl_ctrl.horizon <= 0:
        errors.append(
            ConfigFieldError(
                "algorithm.kl_ctrl.horizon",
                kl_ctrl.horizon,
                "must be > 0 for kl_ctrl.type=adaptive",
            )
        )
    return errors + _rollout_correction_problems(v) + _filter_groups_problems(v)


def ratio_bound(threshold: str | float | None) -> float | None:
    """Return ``rollout_rs_threshold`` as one number (verl 0.7's upper ratio), or None when it is
    unset or main's string of bounds (``'0.5_2.0'``, a comma list)."""
    try:
        return float(threshold) if threshold is not None else None
    except ValueError:
        return None


def _rejection_option_problems(rc: RolloutCorrectionConfig, key: str) -> list[ConfigFieldError]:
    """Return the error of a ``rollout_rs`` that is neither one of verl 0.7's levels nor a list
    of main's options, or whose threshold those options cannot read."""
    if rc.rollout_rs is None:
        return []
    if rc.rollout_rs in ROLLOUT_RS_LEVELS:
        if rc.rollout_rs_threshold is not None and ratio_bound(rc.rollout_rs_threshold) is None:
            return [
                ConfigFieldError(
                    f"{key}.rollout_rs_threshold",
                    rc.rollout_rs_threshold,
                    f"rollout_rs={rc.rollout_rs} (verl 0.7) takes one upper ratio; bounds "
                    "as 'lower_upper' belong to main's k1 options (token_k1, ...)",
                )
            ]
        upper = ratio_bound(rc.rollout_rs_threshold)
        if upper is not None and upper <= 0:
            return [ConfigFieldError(f"{key}.rollout_rs_threshold", upper, "must be > 0")]
        return []
    unknown = [
        part.strip()
        for part in rc.rollout_rs.split(",")
        if part.strip() and part.strip() not in ROLLOUT_RS_OPTIONS
    ]
    if unknown or not rc.rollout_rs.strip(" ,"):
        return [
            ConfigFieldError(
                f"{key}.rollout_rs",
                rc.rollout_rs,
                f"must be one of verl 0.7's levels {', '.join(ROLLOUT_RS_LEVELS)}, or verl "
                f"main's options, comma-separated: {', '.join(ROLLOUT_RS_OPTIONS)}",
            )
        ]
    if rc.rollout_rs_threshold is None:
        return []
    try:
        parse_rejection_options(rc.rollout_rs, rc.rollout_rs_threshold)
    except ValueError as error:
        return [
            ConfigFieldError(f"{key}.rollout_rs_threshold", rc.rollout_rs_threshold, str(error))
        ]
    if rc.rollout_rs_threshold_lower is not None:
        return [
            ConfigFieldError(
                f"{key}.rollout_rs_threshold_lower",
                rc.rollout_rs_threshold_lower,
                f"applies to verl 0.7's levels only; for rollout_rs={rc.rollout_rs} write the "
                "bounds into rollout_rs_threshold as 'lower_upper' and unset it",
            )
        ]
    return []


def _rollout_correction_problems(v: Validation) -> list[ConfigFieldError]:
    """Return the errors of ``algorithm.rollout_correction``'s keys together (each one's range is a
    bound) and against the policy loss."""
    cfg = v.cfg
    rc, key, errors = cfg.algorithm.rollout_correction, "algorithm.rollout_correction", []
    if rc.rollout_rs is not None and rc.rollout_rs_threshold is None:
        errors.append(
            ConfigFieldError(
                f"{key}.rollout_rs_threshold",
                None,
                f"must be set when rollout_rs={rc.rollout_rs} (verl requires it), e.g. "
                "'0.999_1.001' for seq_mean_k1, 0.01 for seq_mean_k3, 2.0 for token or sequence",
            )
        )
    errors += _rejection_option_problems(rc, key)
    for name in ("rollout_rs_threshold", "rollout_rs_threshold_lower"):
        if rc.rollout_rs is None and getattr(rc, name) is not None:
            errors.append(
                ConfigFieldError(
                    f"{key}.{name}",
                    getattr(rc, name),
                    "applies only with rollout_rs; set rollout_rs or unset it",
                )
            )
    upper, lower = ratio_bound(rc.rollout_rs_threshold), rc.rollout_rs_threshold_lower
    if upper is not None and lower is not None and lower >= upper:
        errors.append(
            ConfigFieldError(
                f"{key}.rollout_rs_threshold_lower",
                lower,
                f"must be < rollout_rs_threshold ({upper}); null uses 1 / rollout_rs_threshold",
            )
        )
    if rc.rollout_is_batch_normalize and rc.rollout_is is None:
        errors.append(
            ConfigFieldError(
                f"{key}.rollout_is_batch_normalize",
                True,
                "normalises the IS weights, so it needs rollout_is=token or sequence",
            )
        )
    if rc.loss_type != "ppo_clip" and not rc.bypass_mode:
        errors.append(
            ConfigFieldError(
                f"{key}.loss_type",
                rc.loss_type,
                "is the loss of bypass mode; set algorithm.rollout_correction.bypass_mode=True "
                "or leave loss_type at ppo_clip",
            )
        )
    loss_mode = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
    if rc.bypass_mode and loss_mode not in ("vanilla", "bypass_mode"):
        errors.append(
            ConfigFieldError(
                f"{key}.bypass_mode",
                True,
                f"replaces the policy loss with bypass mode's (loss_type={rc.loss_type}), so "
                f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode} would be ignored; "
                "leave loss_mode at vanilla or turn bypass_mode off",
            )
        )
    return errors


def _filter_groups_problems(v: Validation) -> list[ConfigFieldError]:
    """Return the errors of DAPO's group filtering: a metric the rewards record, the KL it is
    taken before, and groups to filter."""
    cfg = v.cfg
    fg, key = cfg.algorithm.filter_groups, "algorithm.filter_groups"
    if not fg.enable:
        return []
    metric, manager, errors = fg.metric, cfg.reward_model.reward_manager, []
    others = bool(cfg.custom_reward_function.path or cfg.reward.components)
    if metric is None:
        errors.append(
            ConfigFieldError(
                f"{key}.metric",
                None,
                "must be set with filter_groups.enable=True: acc, score, seq_reward or "
                "seq_final_reward",
            )
        )
    elif metric == "acc" and manager != "dapo" and not others:
        errors.append(
            ConfigFieldError(
                f"{key}.metric",
                metric,
                "acc is recorded by reward_model.reward_manager=dapo (each float score is its "
                "acc, as verl's DAPO manager) or by a reward function returning {'acc': ...}; set "
                "reward_model.reward_manager=dapo or metric=score",
            )
        )
    elif metric not in ("acc", "score", "seq_reward", "seq_final_reward") and not others:
        errors.append(
            ConfigFieldError(
                f"{key}.metric",
                metric,
                "the built-in rewards produce acc (with reward_manager=dapo), score, seq_reward "
                "and seq_final_reward; another name needs a custom_reward_function that returns it",
            )
        )
    if metric == "seq_final_reward" and cfg.algorithm.use_kl_in_reward:
        errors.append(
            ConfigFieldError(
                f"{key}.metric",
                metric,
                "seq_final_reward with algorithm.use_kl_in_reward=True needs the KL penalty "
                "before filtering, which this engine applies after it; use seq_reward, or the KL "
                "loss (actor.use_kl_loss) instead of the KL in the reward",
            )
        )
    if cfg.actor_rollout_ref.rollout.n < 2:
        errors.append(
            ConfigFieldError(
                f"{key}.enable",
                True,
                "filters groups of responses to one prompt, so it needs "
                "actor_rollout_ref.rollout.n >= 2 (a group of one is always kept)",
            )
        )
    return errors
