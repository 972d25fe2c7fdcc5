"""``algorithm``: the advantage estimator, the KL in the reward, PF-PPO, rollout correction and
DAPO's group filtering.

verl's ``AlgoConfig`` (``verl/trainer/config/algorithm.py``).
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
)
from engine.config.fields import MAX_STEPS, _f, _Section, _section, _target


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
        "Rejection sampling: mask out tokens (token), responses (sequence: product of ratios) or "
        "responses by the geometric mean of their ratios (geometric) outside "
        "[rollout_rs_threshold_lower, rollout_rs_threshold]; null: none.",
        choices=ROLLOUT_RS_LEVELS,
    )
    rollout_rs_threshold: float | None = _f(
        None, "Upper ratio of rejection sampling; required when rollout_rs is set.", gt=0
    )
    rollout_rs_threshold_lower: float | None = _f(
        None, "Lower ratio of rejection sampling; null: 1 / rollout_rs_threshold.", gt=0
    )
    rollout_token_veto_threshold: float | None = _f(
        None,
        "Mask out a whole response holding a token whose ratio is under this (e.g. 1e-4); "
        "null: off.",
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
