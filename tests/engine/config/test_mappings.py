"""Every dict-valued key of the schema holds data only: no loader argument, file, module or code.

The schema is walked here independently of ``engine.config.mappings``: a dict key added to any
section without a rule in ``MAPPING_RULES`` fails ``test_every_dict_valued_key_has_a_rule``, and
every rule must refuse each hostile value below, naming the key.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import re
import types
import typing
from pathlib import Path

import pytest

import engine
import engine.config
from engine.config import PPOConfig, load_config, validate_config
from engine.config.fields import ConfigValidationError, _Section
from engine.config.mappings import (
    LOADER_ARGUMENTS,
    MAPPING_RULES,
    MODEL_CONFIG_ATTRIBUTES,
    REFUSED_ATTRIBUTES,
    files_named,
    reference_problem,
)

REPO = Path(__file__).resolve().parents[3]
# What a member could hand a loader, an engine or a function to reach files or code.
HOSTILE = {
    "subfolder up": {"subfolder": "../../other/checkpoints/global_step_1/actor/huggingface"},
    "subfolder absolute": {"subfolder": "/srv/runs/7/checkpoints/global_step_1/huggingface"},
    "offload folder": {"offload_folder": "/tmp/anywhere", "device_map": {"": "disk"}},
    "remote code": {"trust_remote_code": True},
    "auto_map": {"auto_map": {"AutoModelForCausalLM": "evil/repo--modeling_evil.Evil"}},
    "class by name": {"reward_cls": "evil.module.Reward"},
    "function by name": {"score_fn": "os:system"},
    "nested path": {"text_config": {"weights": "/etc/passwd"}},
    "home path": {"cache": "~/.ssh/id_rsa"},
    "python object": {"hook": object()},
}
# The cases that are only a file path: a reward function may take one (its own log file), so the
# engine lets it through where a rule says ``files`` and the studio checks it as a path key
# (tests/webapp/experiments/test_config_paths.py).
FILE_CASES = {"nested path", "home path"}
# Keys nothing reads: their values are kept to show (``+key=value`` extras).
UNREAD = {"extras"}


def _is_dict(tp) -> bool:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return any(_is_dict(arg) for arg in typing.get_args(tp))
    return tp is typing.Any or tp is dict or typing.get_origin(tp) in (dict, typing.Mapping)


def dict_keys(cls: type = PPOConfig, prefix: str = "") -> set[str]:
    """Return the dotted keys of every dict-typed (or free-form) field reachable from ``cls``."""
    found = set()
    for f in dataclasses.fields(cls):
        if f.metadata.get("runtime"):
            continue
        tp = typing.get_type_hints(cls)[f.name]
        item = typing.get_args(tp)[0] if typing.get_origin(tp) is list else None
        if dataclasses.is_dataclass(tp):
            found |= dict_keys(tp, f"{prefix}{f.name}.")
        elif item is not None and dataclasses.is_dataclass(item):
            found |= dict_keys(item, f"{prefix}{f.name}[].")
        elif _is_dict(tp):
            found.add(prefix + f.name)
    return found


def reachable(cls: type = PPOConfig, seen: set | None = None) -> set[type]:
    seen = set() if seen is None else seen
    seen.add(cls)
    for tp in typing.get_type_hints(cls).values():
        for inner in (tp, *typing.get_args(tp)):
            if dataclasses.is_dataclass(inner) and inner not in seen:
                reachable(inner, seen)
    return seen


def test_every_dict_valued_key_has_a_rule():
    assert dict_keys() == set(MAPPING_RULES), "give each dict key a rule in MAPPING_RULES"


def test_every_config_section_with_a_dict_field_is_in_the_schema():
    """A section defined in engine/config but not (yet) reachable from PPOConfig is not skipped."""
    sections = set()
    for module in pkgutil.iter_modules(engine.config.__path__):
        mod = importlib.import_module(f"engine.config.{module.name}")
        sections |= {
            obj
            for obj in vars(mod).values()
            if isinstance(obj, type) and issubclass(obj, _Section) and dataclasses.is_dataclass(obj)
        }
    with_dicts = {
        cls
        for cls in sections
        if any(
            _is_dict(typing.get_type_hints(cls)[f.name]) and not f.metadata.get("runtime")
            for f in dataclasses.fields(cls)
        )
    }
    assert with_dicts - reachable() == set()


def config_with(key: str, value: dict) -> PPOConfig:
    cfg = load_config("grpo_tiny.yaml")
    head, sep, tail = key.partition("[].")
    if sep:  # a list of sections: put the mapping in a first item
        section = engine.config.reward.RewardComponent(name="gsm8k")
        setattr(section, tail, value)
        cfg.reward.components = [section]
        return cfg
    *parents, name = head.split(".")
    obj = cfg
    for part in parents:
        obj = getattr(obj, part)
    setattr(obj, name, value)
    return cfg


def errors_of(cfg: PPOConfig) -> dict[str, str]:
    try:
        validate_config(cfg, check_files=False)
    except ConfigValidationError as exc:
        return {error.key: error.message for error in exc.errors}
    return {}


def error_keys(cfg: PPOConfig) -> list[str]:
    return list(errors_of(cfg))


@pytest.mark.parametrize("key", sorted(set(MAPPING_RULES) - UNREAD))
@pytest.mark.parametrize("case", list(HOSTILE))
def test_every_mapping_refuses_loader_arguments_paths_and_code(key, case):
    stem = key.replace("[]", "[0]")
    found = errors_of(config_with(key, HOSTILE[case]))
    if MAPPING_RULES[key].files and case in FILE_CASES:  # the studio's to check
        assert not any(m.startswith("names a file") for m in found.values()), found
        assert list(files_named(stem, HOSTILE[case]))
        return
    assert any(k == stem or k.startswith(f"{stem}.") for k in found), (key, case, found)


def test_keys_read_by_nothing_are_not_read_outside_the_config_package():
    for key in UNREAD:
        pattern = re.compile(rf"\.{key}\b|\[[\"']{key}[\"']\]")
        for root in ("engine", "workers"):
            for path in (REPO / root).rglob("*.py"):
                if "config" in path.relative_to(REPO).parts[:2]:
                    continue
                assert not pattern.search(path.read_text()), f"{path} reads config.{key}"


def refusals(**override_config) -> dict[str, str]:
    cfg = load_config("grpo_tiny.yaml")
    cfg.actor_rollout_ref.model.override_config = override_config
    try:
        validate_config(cfg, check_files=False)
    except ConfigValidationError as exc:
        return {error.key: error.message for error in exc.errors}
    return {}


def test_override_config_takes_config_attributes_and_names_each_refused_key_with_the_fix():
    assert refusals(attention_dropout=0.1, rope_theta=5e5, attn_implementation="sdpa") == {}
    assert refusals(rope_parameters={"rope_type": "linear", "factor": 2.0}) == {}
    key = "actor_rollout_ref.model.override_config"
    found = refusals(subfolder="../x", offload_folder="/tmp/x", cache_dir="/tmp/c", revision="x")
    assert set(found) == {
        f"{key}.{n}" for n in ("subfolder", "offload_folder", "cache_dir", "revision")
    }
    assert found[f"{key}.subfolder"] == (
        "an argument of the model loader, not a model config attribute; the engine loads models "
        "itself; leave it out"
    )
    found = refusals(auto_map={"AutoModel": "m.M"}, quantization_config={"quant_method": "gptq"})
    assert found[f"{key}.auto_map"].startswith(
        "not a config attribute to change: names remote code"
    )
    assert "quantise the model folder beforehand" in found[f"{key}.quantization_config"]
    for name in ("hidden_size", "num_hidden_layers", "vocab_size"):
        assert "sizes the weights" in refusals(**{name: 10**6})[f"{key}.{name}"]
    assert "such as attention_dropout" in refusals(dropout_ratee=0.1)[f"{key}.dropout_ratee"]
    assert refusals(attn_implementation="kernels-community/flash-attn") == {
        f"{key}.attn_implementation": "must be one of eager, sdpa, flash_attention_2, "
        "flash_attention_3, flex_attention"
    }
    assert f"{key}.rope_parameters.rope_type" in refusals(rope_parameters={"rope_type": "a/b"})
    assert refusals(text_config={"auto_map": {}}) != {}  # nested: refused wherever it is
    assert LOADER_ARGUMENTS.keys().isdisjoint(MODEL_CONFIG_ATTRIBUTES)
    assert REFUSED_ATTRIBUTES.keys().isdisjoint(MODEL_CONFIG_ATTRIBUTES)


def test_a_model_folders_own_config_attributes_are_accepted_but_never_a_loader_argument(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(
        '{"model_type": "qwen2", "my_family_gate": 1, "subfolder": "x", "auto_map": {}}'
    )
    cfg = load_config("grpo_tiny.yaml", overrides=[f"actor_rollout_ref.model.path={folder}"])
    cfg.actor_rollout_ref.model.override_config = {"my_family_gate": 2}
    assert error_keys(cfg) == []
    for name in ("subfolder", "auto_map", "model_type", "other_gate"):
        cfg.actor_rollout_ref.model.override_config = {name: {}}
        assert error_keys(cfg) == [f"actor_rollout_ref.model.override_config.{name}"], name


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("/etc/passwd", "names a file or folder"),
        ("~/x", "names a file or folder"),
        ("a/../../b", "names a file or folder"),
        ("file:///etc/passwd", "names a file or folder"),
        ("C:\\models", "names a file or folder"),
        ("os.system", "names a Python module, class or function"),
        ("posix:system", "names a Python module, class or function"),
        ("repo--modeling.Evil", "names a Python module, class or function"),
        ("</answer>", None),
        ("flexible", None),
        ("0.5", None),
        ("Think step by step.", None),
    ],
)
def test_reference_problem_tells_paths_and_code_from_data(text, problem):
    assert reference_problem(text) == problem


def test_strict_mappings_also_refuse_a_relative_folder_or_a_hub_repo():
    assert reference_problem("org/model", strict=True) == "names a folder or a Hub repository"
    assert reference_problem("org/model") is None


def test_data_in_reward_kwargs_and_chat_template_variables_passes():
    cfg = load_config("grpo_tiny.yaml")
    cfg.custom_reward_function.reward_kwargs = {"method": "flexible", "tag": "</answer>", "k": [1]}
    cfg.reward_model.reward_manager = "batch"
    cfg.custom_reward_function.path = "rewards.py"  # batch calls a custom function
    cfg.reward_model.reward_kwargs = {"log_path": "/tmp/calls.log"}  # the studio checks it
    cfg.data.apply_chat_template_kwargs = {"enable_thinking": False, "reasoning_effort": "low"}
    assert error_keys(cfg) == []
    cfg.data.apply_chat_template_kwargs = {"chat_template": "{{ evil }}", "tokenize": True}
    assert error_keys(cfg) == [
        "data.apply_chat_template_kwargs.chat_template",
        "data.apply_chat_template_kwargs.tokenize",
    ]
