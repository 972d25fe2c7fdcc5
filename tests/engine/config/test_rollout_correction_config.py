"""algorithm.rollout_correction validates as verl reads it: choices, bounds and key pairs."""

from __future__ import annotations

import pytest
import torch

from tests.engine.config.test_validate import problems

KEY = "algorithm.rollout_correction"


def test_verls_recipes_validate():
    assert problems([f"{KEY}.rollout_is=token"]) == {}
    assert problems([f"{KEY}.rollout_is=sequence", f"{KEY}.rollout_is_batch_normalize=True"]) == {}
    assert (
        problems(
            [
                f"{KEY}.rollout_rs=geometric",
                f"{KEY}.rollout_rs_threshold=1.001",
                f"{KEY}.rollout_rs_threshold_lower=0.999",
                f"{KEY}.rollout_token_veto_threshold=1e-4",
            ]
        )
        == {}
    )
    assert problems([f"{KEY}.bypass_mode=True", f"{KEY}.loss_type=reinforce"]) == {}
    main_options = [
        f"{KEY}.rollout_rs='token_k1,seq_max_k3'",
        f"{KEY}.rollout_rs_threshold='0.999_1.001,0.01'",
    ]
    assert problems(main_options) == {}


@pytest.mark.parametrize(
    ("overrides", "key", "message"),
    [
        ([f"{KEY}.rollout_is=geometric"], "rollout_is", "must be one of token, sequence"),
        (
            [f"{KEY}.rollout_rs=row"],
            "rollout_rs",
            "must be one of verl 0.7's levels token, sequence, geometric, or verl main's",
        ),
        (
            [f"{KEY}.rollout_rs=token_k2,seq_max_k4", f"{KEY}.rollout_rs_threshold=0.1"],
            "rollout_rs",
            "seq_max_k2, seq_max_k3",
        ),
        (
            [f"{KEY}.rollout_rs=seq_mean_k3", f"{KEY}.rollout_rs_threshold='0.9_1.1'"],
            "rollout_rs_threshold",
            "k2 and k3 take an upper bound only",
        ),
        (
            [f"{KEY}.rollout_rs=token", f"{KEY}.rollout_rs_threshold='0.9_1.1'"],
            "rollout_rs_threshold",
            "takes one upper ratio",
        ),
        (
            [
                f"{KEY}.rollout_rs=token_k1",
                f"{KEY}.rollout_rs_threshold=2.0",
                f"{KEY}.rollout_rs_threshold_lower=0.4",
            ],
            "rollout_rs_threshold_lower",
            "as 'lower_upper'",
        ),
        (
            [f"{KEY}.bypass_mode=True", f"{KEY}.loss_type=a2c"],
            "loss_type",
            "must be one of ppo_clip, reinforce",
        ),
        ([f"{KEY}.rollout_is_threshold=0"], "rollout_is_threshold", "> 0"),
        ([f"{KEY}.rollout_token_veto_threshold=-1"], "rollout_token_veto_threshold", "> 0"),
        ([f"{KEY}.rollout_rs=token"], "rollout_rs_threshold", "must be set when rollout_rs"),
        (
            [f"{KEY}.rollout_rs=sequence", f"{KEY}.rollout_rs_threshold=0"],
            "rollout_rs_threshold",
            "must be > 0",
        ),
        ([f"{KEY}.rollout_rs_threshold=2.0"], "rollout_rs_threshold", "applies only with"),
        (
            [
                f"{KEY}.rollout_rs=token",
                f"{KEY}.rollout_rs_threshold=2.0",
                f"{KEY}.rollout_rs_threshold_lower=2.0",
            ],
            "rollout_rs_threshold_lower",
            "must be < rollout_rs_threshold",
        ),
        (
            [f"{KEY}.rollout_is_batch_normalize=True"],
            "rollout_is_batch_normalize",
            "needs rollout_is",
        ),
        ([f"{KEY}.loss_type=reinforce"], "loss_type", "set algorithm.rollout_correction.bypass"),
        (
            [f"{KEY}.bypass_mode=True", "actor_rollout_ref.actor.policy_loss.loss_mode=gspo"],
            "bypass_mode",
            "loss_mode=gspo would be ignored",
        ),
    ],
)
def test_bad_settings_name_the_key_and_the_fix(overrides, key, message):
    found = problems(overrides)
    assert f"{KEY}.{key}" in found, found
    assert message in found[f"{KEY}.{key}"]


def test_verls_bypass_mode_loss_name_goes_with_bypass_mode():
    from engine.algorithms.policy_loss.base import PolicyLossInputs, get_policy_loss_fn
    from engine.algorithms.policy_loss.bypass_mode import compute_policy_loss_bypass_mode
    from engine.config.actor import ActorConfig

    loss_mode = "actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode"
    assert problems([loss_mode, f"{KEY}.bypass_mode=True"]) == {}  # as verl's trainer sets it
    found = problems([loss_mode])
    assert (
        "rollout_correction.bypass_mode=True"
        in found["actor_rollout_ref.actor.policy_loss.loss_mode"]
    )
    loss = get_policy_loss_fn("bypass_mode")
    assert loss is compute_policy_loss_bypass_mode
    old = -torch.rand(2, 3, dtype=torch.float64)
    new, advantages, mask = old + 0.1, torch.ones(2, 3, dtype=torch.float64), torch.ones(2, 3)
    settings = {"loss_type": "reinforce", "rollout_is": "token", "rollout_is_threshold": 2.0}
    settings |= {
        k: None
        for k in (
            "rollout_rs",
            "rollout_rs_threshold",
            "rollout_rs_threshold_lower",
            "rollout_token_veto_threshold",
        )
    }
    settings |= {"rollout_is_batch_normalize": False, "bypass_mode": True}
    config = ActorConfig()
    config.policy_loss.rollout_correction = settings  # what the actor does in bypass mode
    inputs = PolicyLossInputs(old, new, advantages, mask)
    reinforce, _ = loss(inputs, config)
    ppo_clip, _ = loss(inputs, ActorConfig())  # no section: verl's defaults, PPO's clipped loss
    # REINFORCE's -A log pi w, with w = pi / pi_rollout = e^0.1 under the threshold 2.
    expected = -(new * torch.exp(torch.tensor(0.1, dtype=torch.float64))).mean()
    assert reinforce.item() == pytest.approx(expected.item())
    assert not torch.equal(reinforce, ppo_clip)
