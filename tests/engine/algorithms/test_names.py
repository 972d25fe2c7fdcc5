"""The algorithm registries accept exactly the names listed in engine.algorithms.names."""

import dataclasses

import pytest
import torch

from engine.algorithms.advantages import (
    ADV_ESTIMATOR_REGISTRY,
    AdvantageEstimator,
    register_adv_est,
)
from engine.algorithms.kl import get_kl_controller
from engine.algorithms.loss_aggregation import agg_loss
from engine.algorithms.names import (
    ADV_ESTIMATORS,
    GROUP_ESTIMATORS,
    KL_CONTROLLER_TYPES,
    KL_TYPES,
    LOSS_AGG_MODES,
    POLICY_LOSS_MODES,
)
from engine.algorithms.policy_loss.base import POLICY_LOSS_REGISTRY, register_policy_loss
from engine.config.actor import ActorConfig, PolicyLossConfig
from engine.config.algorithm import AlgorithmConfig, KLControlConfig
from engine.config.critic import CriticConfig


def test_every_registered_estimator_is_listed_and_every_listed_one_registered():
    assert sorted(ADV_ESTIMATOR_REGISTRY) == sorted(ADV_ESTIMATORS)
    assert sorted(e.value for e in AdvantageEstimator) == sorted(ADV_ESTIMATORS)
    assert set(GROUP_ESTIMATORS) < set(ADV_ESTIMATORS)


def test_every_registered_policy_loss_is_listed_and_every_listed_one_registered():
    assert sorted(POLICY_LOSS_REGISTRY) == sorted(POLICY_LOSS_MODES)


def test_every_listed_loss_agg_mode_and_kl_controller_works():
    loss = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    for mode in LOSS_AGG_MODES:
        agg_loss(loss, mask, mode)  # no ValueError
    for kind in KL_CONTROLLER_TYPES:
        get_kl_controller({"type": kind})


def test_registering_an_unlisted_name_fails_and_names_the_list():
    with pytest.raises(ValueError, match=r"'ppo2' is not listed; add it to .*\.ADV_ESTIMATORS"):
        register_adv_est("ppo2")(lambda: None)
    with pytest.raises(ValueError, match=r"'dapo' is not listed; add it to .*\.POLICY_LOSS_MODES"):
        register_policy_loss("dapo")(lambda: None)
    assert "ppo2" not in ADV_ESTIMATOR_REGISTRY and "dapo" not in POLICY_LOSS_REGISTRY


def _choices(section: type, name: str) -> tuple[str, ...]:
    return {f.name: f for f in dataclasses.fields(section)}[name].metadata["choices"]


def test_the_schema_choices_are_the_listed_names():
    assert _choices(AlgorithmConfig, "adv_estimator") is ADV_ESTIMATORS
    assert _choices(AlgorithmConfig, "kl_penalty") is KL_TYPES
    assert _choices(ActorConfig, "kl_loss_type") is KL_TYPES
    assert _choices(ActorConfig, "loss_agg_mode") is LOSS_AGG_MODES
    assert _choices(CriticConfig, "loss_agg_mode") is LOSS_AGG_MODES
    assert _choices(PolicyLossConfig, "loss_mode") is POLICY_LOSS_MODES
    assert _choices(KLControlConfig, "type") is KL_CONTROLLER_TYPES
