"""``override_config`` reaches the loaded model's config, and never ``from_pretrained``'s arguments.

On the project's tiny model (``tiny://model``, a 4-layer Qwen2): the overrides are config
attributes set before the weights load, as verl's ``update_model_config``; a loader argument
(``subfolder``, ``offload_folder``, ...) is refused before anything is read or written.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

from engine.config import PPOConfig
from engine.config.fields import ConfigValidationError
from engine.roles.model_loading import load_critic, load_policy
from engine.tools.tiny_uris import resolve_tiny_uri

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tiny_model():
    from engine.tiny import ensure_tiny_assets

    return str(ensure_tiny_assets().model_dir)


@pytest.fixture
def loader_calls(monkeypatch):
    """Record the keyword arguments of every ``from_pretrained`` of the two model classes."""
    calls: list[dict] = []
    for cls in (AutoModelForCausalLM, AutoModelForTokenClassification):
        original = cls.from_pretrained.__func__

        def spy(klass, *args, _original=original, **kwargs):
            calls.append(kwargs)
            return _original(klass, *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(spy))
    return calls


def policy_config(**override_config):
    model = PPOConfig().actor_rollout_ref.model
    model.path, model.override_config = "tiny://model", override_config
    model.enable_gradient_checkpointing = False
    return model


def test_an_override_reaches_the_loaded_config_and_no_loader_argument(tiny_model, loader_calls):
    model = load_policy(policy_config(attention_dropout=0.25, rope_theta=12345.0), CPU)
    assert model.config.attention_dropout == 0.25
    assert model.config.rope_parameters == {"rope_theta": 12345.0, "rope_type": "default"}
    # The rotary embedding was built from the overridden base: 1 / theta^(2i / head_dim).
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    expected = 1.0 / 12345.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    torch.testing.assert_close(model.model.rotary_emb.inv_freq, expected)
    assert [set(kwargs) for kwargs in loader_calls] == [{"config", "dtype", "trust_remote_code"}]
    untouched = load_policy(policy_config(), CPU)
    assert untouched.config.attention_dropout == 0.0
    assert untouched.config.rope_parameters["rope_theta"] == 10000.0


def test_a_mapping_override_merges_into_the_attribute_and_attn_implementation_applies(tiny_model):
    rope = {"rope_type": "linear", "factor": 2.0}
    model = load_policy(policy_config(rope_parameters=rope, attn_implementation="eager"), CPU)
    assert model.config.rope_parameters == {**rope, "rope_theta": 10000.0}
    assert model.config._attn_implementation == "eager"


def test_loader_arguments_in_override_config_are_refused_before_loading(
    tiny_model, tmp_path, loader_calls
):
    other = tmp_path / "other_members_run" / "huggingface"
    shutil.copytree(resolve_tiny_uri("tiny://model"), other)
    offload = tmp_path / "written_by_the_loader"
    hostile = {
        "subfolder": {"subfolder": str(other)},
        "offload_folder": {"offload_folder": str(offload), "device_map": {"": "disk"}},
        "trust_remote_code": {"trust_remote_code": True},
        "auto_map": {"auto_map": {"AutoModelForCausalLM": "evil--modeling.Evil"}},
        "quantization_config": {"quantization_config": {"quant_method": "bitsandbytes"}},
    }
    for name, overrides in hostile.items():
        with pytest.raises(ConfigValidationError) as caught:
            load_policy(policy_config(**overrides), CPU)
        keys = [error.key for error in caught.value.errors]
        assert f"actor_rollout_ref.model.override_config.{name}" in keys, name
    assert loader_calls == [] and not offload.exists()


def test_the_critics_override_config_reaches_the_critic(tiny_model, loader_calls):
    config = PPOConfig()
    config.actor_rollout_ref.model.path = "tiny://model"
    config.critic.model.override_config = {"attention_dropout": 0.5}
    critic = load_critic(config.critic, config.actor_rollout_ref.model, CPU)
    assert critic.config.attention_dropout == 0.5 and critic.config.num_labels == 1
    assert critic.score.out_features == 1
    assert set(loader_calls[0]) == {"config", "dtype", "trust_remote_code"}
    config.critic.model.override_config = {"subfolder": "../../x"}
    with pytest.raises(ConfigValidationError, match=r"critic\.model\.override_config\.subfolder"):
        load_critic(config.critic, config.actor_rollout_ref.model, CPU)
