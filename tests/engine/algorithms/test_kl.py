"""KL estimators, KL in the reward and the KL controllers, on hand-computed values."""

import math
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from engine.algorithms.kl import (
    AdaptiveKLController,
    FixedKLController,
    PIDKLController,
    apply_kl_penalty,
    compute_rewards,
    get_kl_controller,
    kl_penalty,
)

LOGP = torch.tensor([[-1.0, -2.0]])
REF = torch.tensor([[-1.5, -1.0]])


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (("kl", "k1"), [0.5, -1.0]),
        (("abs",), [0.5, 1.0]),
        (("mse", "k2"), [0.125, 0.5]),
        # x = ref - logp = -0.5, 1: exp(x) - x - 1
        (("low_var_kl", "k3", "k3_unclamped"), [math.exp(-0.5) - 0.5, math.exp(1) - 2]),
    ],
)
def test_kl_penalty_estimators(names, expected):
    for name in names:
        torch.testing.assert_close(kl_penalty(LOGP, REF, name), torch.tensor([expected]))


def test_k3_is_non_negative_and_clamped():
    torch.manual_seed(0)
    logp, ref = torch.randn(3, 4) * 5, torch.randn(3, 4) * 5
    assert torch.all(kl_penalty(logp, ref, "k3") >= 0)
    far = kl_penalty(torch.tensor([[-40.0]]), torch.tensor([[0.0]]), "low_var_kl")
    assert far.item() == 10.0  # exp(20) - 21 clamped to 10


def test_k3_unclamped_keeps_value_and_gradient_past_the_clamp():
    # The policy put log-prob -1 on a token the reference gives -14: k3 = exp(-13) + 12 > 10.
    logp, ref = torch.tensor([[-1.0]], requires_grad=True), torch.tensor([[-14.0]])
    clamped = kl_penalty(logp, ref, "low_var_kl")
    assert clamped.item() == 10.0
    clamped.sum().backward()
    assert logp.grad.item() == 0.0  # verl's clamp: no KL gradient on this token
    logp.grad = None
    value = kl_penalty(logp, ref, "k3_unclamped")
    torch.testing.assert_close(value, torch.tensor([[math.exp(-13) + 12]]))
    value.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[1 - math.exp(-13)]]))  # d/dlogp k3


def test_config_accepts_every_estimator_the_loss_computes():
    from engine.algorithms.kl import KL_PENALTY_NAMES
    from engine.algorithms.names import KL_ESTIMATORS, KL_TYPES

    assert KL_ESTIMATORS == KL_PENALTY_NAMES
    for name in KL_TYPES:
        kl_penalty(LOGP, REF, name)  # no ValueError


def test_plus_suffix_keeps_value_and_takes_k2_gradient():
    logp = LOGP.clone().requires_grad_()
    value = kl_penalty(logp, REF, "k3+")
    torch.testing.assert_close(value, kl_penalty(LOGP, REF, "k3"))
    value.sum().backward()
    torch.testing.assert_close(logp.grad, LOGP - REF)


def test_kl_penalty_rejects_unknown_names_and_shapes():
    with pytest.raises(ValueError, match="Unknown kl_penalty 'k4'; valid names are: kl, k1, abs"):
        kl_penalty(LOGP, REF, "k4")
    with pytest.raises(
        ValueError, match=r"logprob has shape \(1, 2\), ref_logprob has shape \(1, 1\)"
    ):
        kl_penalty(LOGP, REF[:, :1], "kl")


def test_compute_rewards_subtracts_scaled_k1():
    scores = torch.tensor([[0.0, 1.0]])
    torch.testing.assert_close(
        compute_rewards(scores, LOGP, REF, 0.1), torch.tensor([[-0.05, 1.1]])
    )


SCORES = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
OLD = torch.full((2, 3), -1.0)
REF3 = torch.tensor([[-1.5, -1.0, -0.5], [-2.0, -1.0, -9.0]])  # k1 = .5, 0, -.5 / 1, 0, (masked 8)


def test_apply_kl_penalty_matches_verl_trainer():
    rewards, metrics = apply_kl_penalty(SCORES, MASK, OLD, REF3, FixedKLController(0.1))
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, 0.0, 1.05], [-0.1, 1.0, 0.0]]))
    # per-sequence masked means 0 and 0.5, averaged over the batch
    assert metrics == pytest.approx(
        {"actor/reward_kl_penalty": 0.25, "actor/reward_kl_penalty_coeff": 0.1}
    )


def test_apply_kl_penalty_updates_the_controller_with_batch_size():
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.1, horizon=10)
    _, metrics = apply_kl_penalty(SCORES, MASK, OLD, REF3, ctrl)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.1  # the coefficient that was applied
    assert ctrl.value == pytest.approx(0.1 * (1 + 0.2 * 2 / 10))  # error 1.5 clipped to 0.2


def test_fixed_and_adaptive_controllers():
    fixed = FixedKLController(0.3)
    fixed.update(current_kl=5.0, n_steps=100)
    assert fixed.value == 0.3
    adaptive = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.1, horizon=10)
    adaptive.update(current_kl=0.05, n_steps=5)  # error -0.5 clipped to -0.2: x0.9
    assert adaptive.value == pytest.approx(0.09)
    adaptive.update(current_kl=0.11, n_steps=10)  # error 0.1: x1.1
    assert adaptive.value == pytest.approx(0.099)


def test_pid_controller_hand_values():
    pid = PIDKLController(init_kl_coef=0.01, target_kl=0.1, kp=0.1, ki=0.01, kd=0.05)
    pid.update(current_kl=0.3, n_steps=8)  # e=0.2, I=0.2, D=0
    assert pid.value == pytest.approx(0.01 + 0.02 + 0.002)
    pid.update(current_kl=0.2, n_steps=8)  # e=0.1, I=0.3, D=-0.1
    assert pid.value == pytest.approx(0.01 + 0.01 + 0.003 - 0.005)


def test_pid_converges_on_a_simulated_kl_process_and_stays_non_negative():
    pid = PIDKLController(init_kl_coef=0.001, target_kl=0.1, kp=0.05, ki=0.05, kd=0.01)
    kl = 0.5
    for _ in range(300):
        # KL relaxes towards 0.3 * exp(-20 beta): a stronger penalty keeps the policy closer.
        kl += 0.5 * (0.3 * math.exp(-20 * pid.value) - kl)
        pid.update(current_kl=kl, n_steps=16)
        assert pid.value >= 0
    assert kl == pytest.approx(0.1, abs=1e-3)
    assert pid.value == pytest.approx(math.log(3) / 20, rel=1e-2)


def test_pid_does_not_wind_up_while_held_at_zero():
    pid = PIDKLController(init_kl_coef=0.001, target_kl=0.1, kp=0.1, ki=0.01)
    for _ in range(1000):
        pid.update(current_kl=0.0, n_steps=16)
        assert pid.value == 0.0
    pid.update(current_kl=0.2, n_steps=16)  # KL jumps above target: respond at once
    assert pid.value == pytest.approx(0.001 + 0.1 * 0.1 + 0.01 * 0.1)


def test_controllers_reject_bad_settings():
    with pytest.raises(ValueError, match="horizon must be greater than 0"):
        AdaptiveKLController(init_kl_coef=0.1, target_kl=0.1, horizon=0)
    with pytest.raises(ValueError, match="target_kl must be greater than 0"):
        PIDKLController(init_kl_coef=0.1, target_kl=0.0)
    with pytest.raises(ValueError, match="PID gains must be >= 0"):
        PIDKLController(init_kl_coef=0.1, target_kl=0.1, kp=-1.0)


@pytest.mark.parametrize(
    "make",
    [dict, OmegaConf.create, lambda d: SimpleNamespace(**d)],
    ids=["dict", "DictConfig", "object"],
)
def test_get_kl_controller_from_config_like(make):
    fixed = get_kl_controller(make({"type": "fixed", "kl_coef": 0.2}))
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.2
    adaptive = get_kl_controller(
        make({"type": "adaptive", "kl_coef": 0.05, "target_kl": 0.2, "horizon": 500})
    )
    assert isinstance(adaptive, AdaptiveKLController)
    assert (adaptive.value, adaptive.target, adaptive.horizon) == (0.05, 0.2, 500)
    pid = get_kl_controller(make({"type": "pid", "kl_coef": 0.05, "target_kl": 0.2, "kp": 0.3}))
    assert isinstance(pid, PIDKLController) and (pid.kp, pid.ki) == (0.3, 0.01)


def test_get_kl_controller_defaults_and_errors():
    default = get_kl_controller({})
    assert isinstance(default, FixedKLController) and default.value == 0.001
    with pytest.raises(
        ValueError,
        match="Unknown algorithm.kl_ctrl.type 'pd'; valid types are: fixed, adaptive, pid",
    ):
        get_kl_controller({"type": "pd"})
    with pytest.raises(ValueError, match="horizon must be greater than 0"):
        get_kl_controller({"type": "adaptive", "horizon": 0})
