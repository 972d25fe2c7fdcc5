"""KL estimators, KL in the reward, and the controllers that steer the KL coefficient.

``kl_penalty`` implements verl's per-token estimators of KL(pi || pi_ref) from log-probs of
sampled tokens (J. Schulman, "Approximating KL divergence", http://joschu.net/blog/kl-approx.html):
k1 ``logp - ref`` (unbiased, high variance, can be negative), k2 ``0.5 (logp - ref)^2``, k3
``exp(ref - logp) - (ref - logp) - 1`` (unbiased and never negative), and ``abs``. verl's k3
(``low_var_kl``) is clamped at 10, so a token whose probability rose far above the reference's
gets no KL gradient; ``k3_unclamped`` is k3 as written, the KL term of DeepSeekMath's GRPO and of
TRL's ``GRPOTrainer``. A ``+`` suffix (``k3+``) keeps the estimator's value but takes k2's
gradient, the unbiased gradient of KL.

The controllers share verl's interface, ``.value`` and ``.update(current_kl, n_steps)``:
fixed, adaptive (Ziegler et al., arXiv 1909.08593) and a PID controller that drives the measured
KL to a target without the adaptive controller's bounded 20% proportional steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from engine.algorithms.names import KL_CONTROLLER_TYPES, KL_ESTIMATORS
from engine.algorithms.torch_functional import check_same_shape, masked_mean

if TYPE_CHECKING:
    from engine.config.algorithm import KLControlConfig

KL_PENALTY_NAMES = KL_ESTIMATORS  # the names kl_penalty computes, listed in names.py


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Return the per-token KL estimate named ``kl_penalty`` between policy and reference.

    ``kl``/``k1``: ``logp - ref``; ``abs``: ``|logp - ref|``; ``mse``/``k2``:
    ``0.5 (logp - ref)^2``; ``low_var_kl``/``k3``: with ``x = clamp(ref - logp, -20, 20)``,
    ``clamp(exp(x) - x - 1, -10, 10)``; ``k3_unclamped``: ``exp(x) - x - 1`` with
    ``x = ref - logp``. Append ``+`` for k2's gradient with the named value.
    Shapes: logprob, ref_logprob ``(bs, L)`` -> ``(bs, L)``.
    """
    check_same_shape(logprob=logprob, ref_logprob=ref_logprob)
    straight_through = kl_penalty.endswith("+")
    name = kl_penalty[:-1] if straight_through else kl_penalty
    if name in ("kl", "k1"):
        forward = logprob - ref_logprob
    elif name == "abs":
        forward = (logprob - ref_logprob).abs()
    elif name in ("mse", "k2"):
        forward = 0.5 * (logprob - ref_logprob).square()
    elif name in ("low_var_kl", "k3"):
        x = torch.clamp(ref_logprob - logprob, min=-20, max=20)
        forward = torch.clamp(torch.exp(x) - x - 1, min=-10, max=10)
    elif name == "k3_unclamped":
        x = ref_logprob - logprob
        forward = torch.exp(x) - x - 1
    else:
        raise ValueError(
            f"Unknown kl_penalty {kl_penalty!r}; valid names are: {', '.join(KL_PENALTY_NAMES)} "
            "(each may end with '+' for k2's gradient)."
        )
    if not straight_through:
        return forward
    backward = 0.5 * (logprob - ref_logprob).square()
    return backward - backward.detach() + forward.detach()


_kl_estimate = kl_penalty  # apply_kl_penalty's argument of the same name shadows the function


def compute_rewards(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    kl_ratio: float,
) -> torch.Tensor:
    """Return ``scores - kl_ratio * (old_logp - ref_logp)``: token rewards with a k1 KL penalty.

    Ziegler et al., arXiv 1909.08593. Shapes: all ``(bs, L)`` -> ``(bs, L)``.
    """
    check_same_shape(
        token_level_scores=token_level_scores, old_log_prob=old_log_prob, ref_log_prob=ref_log_prob
    )
    return token_level_scores - (old_log_prob - ref_log_prob) * kl_ratio


class KLController(Protocol):
    """What the trainer needs of a KL controller: the coefficient and a way to update it."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None: ...


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    response_mask: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    kl_ctrl: KLController,
    kl_penalty: str = "kl",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Return token rewards ``scores - beta * kl * mask`` and the KL metrics; update ``kl_ctrl``.

    As verl's ray_trainer does for ``algorithm.use_kl_in_reward``: ``current_kl`` is the masked
    mean KL of each sequence averaged over the batch, and the controller is updated with it and
    ``n_steps = bs``. Metrics: ``actor/reward_kl_penalty`` (current_kl) and
    ``actor/reward_kl_penalty_coeff`` (the beta that was applied, before the update).
    Shapes: all ``(bs, L)`` -> token_level_rewards ``(bs, L)``.
    """
    check_same_shape(
        token_level_scores=token_level_scores,
        response_mask=response_mask,
        old_log_prob=old_log_prob,
        ref_log_prob=ref_log_prob,
    )
    kld = _kl_estimate(old_log_prob, ref_log_prob, kl_penalty) * response_mask  # (bs, L)
    beta = kl_ctrl.value
    token_level_rewards = token_level_scores - beta * kld  # (bs, L)
    current_kl = masked_mean(kld, response_mask, axis=-1).mean(dim=0).item()
    kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    return token_level_rewards, {
        "actor/reward_kl_penalty": current_kl,
        "actor/reward_kl_penalty_coeff": beta,
    }


class FixedKLController:
    """A constant KL coefficient (``algorithm.kl_ctrl.type=fixed``)."""

    def __init__(self, kl_coef: float) -> None:
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """Keep the coefficient unchanged."""


class AdaptiveKLController:
    """The adaptive KL coefficient of Ziegler et al., arXiv 1909.08593.

    ``err = clip(kl / target - 1, -0.2, 0.2)``; ``beta *= 1 + err * n_steps / horizon``.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float) -> None:
        if target_kl <= 0:
            raise ValueError(
                f"target_kl must be greater than 0 for the adaptive controller, got {target_kl}."
            )
        if horizon <= 0:
            raise ValueError(
                f"horizon must be greater than 0 for the adaptive controller, got {horizon}."
            )
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move the coefficient towards the target by at most 20% per horizon of samples."""
        proportional_error = float(np.clip(current_kl / self.target - 1, -0.2, 0.2))
        self.value *= 1 + proportional_error * n_steps / self.horizon


class PIDKLController:
    """A PID controller on ``error = current_kl - target_kl`` that sets the KL coefficient.

    ``beta = init_kl_coef + kp * e + ki * sum(e) + kd * (e - e_prev)``, floored at 0 so the
    penalty never turns into a bonus. Anti-windup by conditional integration: while the output
    is held at 0 and the error still pushes it down, the integral is frozen, so a long stretch
    below target does not delay the response once KL rises. Each ``update`` is one control
    step; ``n_steps`` is accepted for the common interface and does not scale the gains.
    """

    def __init__(
        self,
        init_kl_coef: float,
        target_kl: float,
        kp: float = 0.1,
        ki: float = 0.01,
        kd: float = 0.0,
    ) -> None:
        if init_kl_coef < 0:
            raise ValueError(
                f"init_kl_coef must be >= 0 for the PID controller, got {init_kl_coef}."
            )
        if target_kl <= 0:
            raise ValueError(
                f"target_kl must be greater than 0 for the PID controller, got {target_kl}."
            )
        if min(kp, ki, kd) < 0:
            raise ValueError(f"PID gains must be >= 0, got kp={kp}, ki={ki}, kd={kd}.")
        self.value = init_kl_coef
        self.init_kl_coef = init_kl_coef
        self.target = target_kl
        self.kp, self.ki, self.kd = kp, ki, kd
        self.integral = 0.0
        self.prev_error: float | None = None

    def _output(self, error: float, integral: float, derivative: float) -> float:
        """Return the unclamped controller output."""
        return self.init_kl_coef + self.kp * error + self.ki * integral + self.kd * derivative

    def update(self, current_kl: float, n_steps: int) -> None:
        """Set the coefficient from the new KL measurement."""
        error = current_kl - self.target
        derivative = 0.0 if self.prev_error is None else error - self.prev_error
        self.prev_error = error
        integral = self.integral + error
        if self._output(error, integral, derivative) < 0 and error < 0:
            integral = self.integral  # saturated at 0 and pushing further down: do not wind up
        self.integral = integral
        self.value = max(0.0, self._output(error, integral, derivative))


def _config_value(config: KLControlConfig | Mapping[str, Any], key: str, default: Any) -> Any:
    """Return ``config[key]`` for a mapping (dict, DictConfig) or ``config.key`` otherwise."""
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)


def get_kl_controller(
    kl_ctrl: KLControlConfig | Mapping[str, Any],
) -> FixedKLController | AdaptiveKLController | PIDKLController:
    """Return the controller described by an ``algorithm.kl_ctrl`` section (mapping or object).

    Keys, with verl's defaults: ``type`` (fixed), ``kl_coef`` (0.001), ``target_kl`` (0.1),
    ``horizon`` (10000); for ``pid`` also ``kp``, ``ki``, ``kd`` (PIDKLController's defaults).
    """
    kind = _config_value(kl_ctrl, "type", "fixed")
    kl_coef = _config_value(kl_ctrl, "kl_coef", 0.001)
    target_kl = _config_value(kl_ctrl, "target_kl", 0.1)
    if kind == "fixed":
        return FixedKLController(kl_coef=kl_coef)
    if kind == "adaptive":
        horizon = _config_value(kl_ctrl, "horizon", 10000)
        return AdaptiveKLController(init_kl_coef=kl_coef, target_kl=target_kl, horizon=horizon)
    if kind == "pid":
        gains = {
            key: value
            for key in ("kp", "ki", "kd")
            if (value := _config_value(kl_ctrl, key, None)) is not None
        }
        return PIDKLController(init_kl_coef=kl_coef, target_kl=target_kl, **gains)
    raise ValueError(
        f"Unknown algorithm.kl_ctrl.type {kind!r}; valid types are: {', '.join(KL_CONTROLLER_TYPES)}."
    )
