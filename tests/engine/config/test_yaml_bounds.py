"""The YAML reader's bounds: aliases refused, documents and values capped, on every way in."""

from __future__ import annotations

import statistics
import time

import pytest

from engine.config import ConfigError, PPOConfig, config_from_yaml, load_config, set_value
from engine.config.overrides import parse_override
from engine.config.yaml_io import (
    MAX_YAML_BYTES,
    MAX_YAML_DEPTH,
    MAX_YAML_ITEMS,
    MAX_YAML_STRING,
    YamlLimitError,
    yaml_load,
)


def alias_bomb(levels: int = 18, width: int = 5) -> str:
    """Return a YAML mapping whose last key stands for ``width ** levels`` strings (~600 bytes)."""
    lines = ["l0: &l0 [" + ",".join(['"x"'] * width) + "]"]
    for level in range(1, levels):
        lines.append(f"l{level}: &l{level} [" + ",".join([f"*l{level - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def median_seconds(call, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        with pytest.raises(ConfigError):
            call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def test_the_alias_bomb_is_refused_at_its_first_alias_in_well_under_a_second():
    bomb = alias_bomb()
    assert 550 <= len(bomb.encode()) <= 650  # 5**18 (3.8e12) strings in 18 lines
    with pytest.raises(YamlLimitError) as info:
        yaml_load(bomb, "the imported YAML")
    assert str(info.value) == (
        "the imported YAML: an alias (*l0) is not accepted: nested YAML aliases can stand for "
        "billions of values; write the value out in full"
    )
    seconds = median_seconds(lambda: yaml_load(bomb, "the imported YAML"))
    print(f"loader refuses the {len(bomb.encode())}-byte alias bomb in {seconds * 1000:.2f} ms")
    assert seconds < 1.0


@pytest.mark.parametrize(
    "read",
    [
        pytest.param(lambda text: config_from_yaml(text), id="config_from_yaml"),
        pytest.param(
            lambda text: parse_override("data.data_key_map={" + text.replace("\n", ", ") + "}"),
            id="override",
        ),
        pytest.param(
            lambda text: set_value(
                PPOConfig(),
                "actor_rollout_ref.model.override_config",
                "{" + text.replace("\n", ", ") + "}",
            ),
            id="form-field",
        ),
    ],
)
def test_every_way_yaml_comes_in_refuses_aliases(read):
    with pytest.raises(ConfigError, match=r"an alias \(\*l0\) is not accepted"):
        read(alias_bomb())


def test_an_override_names_its_key_and_shows_the_value_cut_short():
    with pytest.raises(ConfigError) as info:
        parse_override("data.data_key_map={" + alias_bomb().replace("\n", ", ") + "}")
    assert info.value.key == "data.data_key_map"
    assert info.value.value.endswith("...") and len(info.value.value) == 63


def test_anchors_without_aliases_and_ordinary_configs_still_load():
    assert yaml_load("a: &first 1\nb: [1, 2]\n") == {"a": 1, "b": [1, 2]}
    for preset in ("ppo_trainer", "grpo_tiny", "ppo_tiny", "grpo_gsm8k"):
        load_config(preset)  # presets are read by the same bounded loader


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "x: '" + "a" * (MAX_YAML_BYTES) + "'",
            f"is {MAX_YAML_BYTES + 5:,} bytes, over the limit of {MAX_YAML_BYTES:,}",
        ),
        (
            "x: " + "a" * (MAX_YAML_STRING + 1),
            f"a YAML value is {MAX_YAML_STRING + 1:,} characters long, over the limit of "
            f"{MAX_YAML_STRING:,}",
        ),
        (
            "[" + ",".join(["1"] * (MAX_YAML_ITEMS + 1)) + "]",
            f"has more than {MAX_YAML_ITEMS:,} items, the limit",
        ),
        (
            "{" + ",".join(f"k{i}: 1" for i in range(MAX_YAML_ITEMS + 1)) + "}",
            f"has more than {MAX_YAML_ITEMS:,} items, the limit",
        ),
        (
            "[" * (MAX_YAML_DEPTH + 1) + "]" * (MAX_YAML_DEPTH + 1),
            f"more than {MAX_YAML_DEPTH} deep",
        ),
        ("x: " + "9" * 5000, "has too many digits"),
    ],
    ids=["document", "string", "list", "mapping", "depth", "digits"],
)
def test_documents_and_values_over_the_limits_are_refused_naming_the_limit(text, message):
    with pytest.raises(YamlLimitError, match="^field: ") as info:
        yaml_load(text, "field")
    assert message in str(info.value)


def test_values_at_the_limits_are_read():
    assert len(yaml_load("[" + ",".join(["1"] * MAX_YAML_ITEMS) + "]")) == MAX_YAML_ITEMS
    assert len(yaml_load("x: " + "a" * MAX_YAML_STRING)["x"]) == MAX_YAML_STRING
    nested = "[" * MAX_YAML_DEPTH + "]" * MAX_YAML_DEPTH
    assert yaml_load(nested) is not None


@pytest.mark.parametrize("text", ["2020-13-45", "!!float abc"])
def test_a_value_yaml_cannot_build_is_invalid_yaml_not_a_crash(text):
    with pytest.raises(ConfigError, match="not valid YAML"):
        yaml_load(f"x: {text}", "field")
    with pytest.raises(ConfigError, match="the value is not valid YAML"):
        set_value(PPOConfig(), "trainer.seed", text)
