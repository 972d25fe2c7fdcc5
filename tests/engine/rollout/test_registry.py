"""Rollout backends by name: the registry, its listed names, and the config's choices."""

from __future__ import annotations

import pytest

from engine.config.rollout import RolloutConfig
from engine.rollout import ROLLOUT_NAMES, get_rollout_builder, register_rollout


def test_the_config_offers_exactly_the_registered_backends():
    assert RolloutConfig.__dataclass_fields__["name"].metadata["choices"] == ROLLOUT_NAMES
    for name in ROLLOUT_NAMES:
        assert callable(get_rollout_builder(name))


def test_an_unlisted_or_twice_registered_backend_is_refused():
    with pytest.raises(
        ValueError, match="'lightllm' is not listed in engine.rollout.names.ROLLOUT_NAMES"
    ):
        register_rollout("lightllm")(lambda *a: None)
    with pytest.raises(ValueError, match="'hf' is registered twice"):
        register_rollout("hf")(lambda *a: None)
    with pytest.raises(ValueError, match="unknown actor_rollout_ref.rollout.name='lightllm'"):
        get_rollout_builder("lightllm")


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_engine_backends_need_a_model_path_not_a_live_module(name):
    with pytest.raises(ValueError, match="loads the model from actor_rollout_ref.model.path"):
        get_rollout_builder(name)(None, None, None, None)
