"""Load ``PPOConfig`` from YAML presets and verl/hydra command-line overrides.

A preset is read as plain YAML; its hydra ``defaults:`` list (or a ``base:`` key) is merged first,
then the overrides are applied to that plain tree, and only then is the tree turned into typed
dataclasses; the overrides (``key=value``, ``+key=value``, ``++key=value``, ``~key``) are read by
``engine.config.overrides``.

``${dotted.key}`` references in typed fields are resolved while loading, those in string fields
by ``resolve_config`` (``engine.config.resolve``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from engine.config.aliases import apply_aliases
from engine.config.fields import ConfigError, ConfigValidationError
from engine.config.keys import _from_dict, config_to_dict
from engine.config.overrides import _applied
from engine.config.resolve import _resolve_typed_references
from engine.config.schema import PPOConfig
from engine.config.tree import deep_merge, expand_dotted_keys
from engine.config.yaml_io import yaml_load

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
DEFAULT_CONFIG = "ppo_trainer.yaml"


def config_from_dict(data: dict[str, Any]) -> PPOConfig:
    """Build a PPOConfig from plain data; unknown keys and wrong types raise ConfigFieldError."""
    if not isinstance(data, dict):
        raise ConfigError(f"a config is a mapping of sections, got {type(data).__name__}")
    return _from_dict(PPOConfig, _resolve_typed_references(apply_aliases(data)), "")


def config_to_yaml(cfg: PPOConfig) -> str:
    """Return the config as YAML text in verl's layout."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False, allow_unicode=True)


def config_from_yaml(text: str) -> PPOConfig:
    """Build a PPOConfig from YAML text (hydra ``defaults:`` name presets in engine/configs)."""
    data = yaml_load(text) or {}
    if not isinstance(data, dict):
        raise ConfigError(
            "the YAML must be a mapping of sections (data:, trainer:, ...) or of dotted keys "
            "(algorithm.adv_estimator: grpo); for key=value override lines use "
            "engine.config.override_lines"
        )
    return config_from_dict(_expand_defaults(data, [CONFIG_DIR], ()))


def _find_config(name: str, search: list[Path]) -> Path:
    candidate = Path(name).expanduser()
    if candidate.is_file():
        return candidate
    names = [name] if name.endswith((".yaml", ".yml")) else [f"{name}.yaml", name]
    for folder in search:
        for filename in names:
            if (folder / filename).is_file():
                return folder / filename
    presets = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))
    raise ConfigError(f"config '{name}' not found; presets in {CONFIG_DIR}: {presets}")


def _read_tree(path: Path, chain: tuple[Path, ...]) -> dict:
    path = path.resolve()
    if path in chain:
        cycle = " -> ".join(p.name for p in (*chain, path))
        raise ConfigError(f"{path}: its defaults form a cycle ({cycle})")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    data = yaml_load(text, str(path)) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    return _expand_defaults(data, [path.parent, CONFIG_DIR], (*chain, path))


def _expand_defaults(data: dict, search: list[Path], chain: tuple[Path, ...]) -> dict:
    """Merge the configs a file names in ``defaults:`` (hydra) or ``base:`` under its own keys."""
    source = str(chain[-1]) if chain else "config"
    data = apply_aliases(
        expand_dotted_keys(data), source
    )  # a tutorial's spellings, checked within this file
    data.pop("hydra", None)  # hydra's own settings (searchpath, run dir) mean nothing here
    entries: list[Any] = []
    if "base" in data:
        entries.append(data.pop("base"))
    defaults = data.pop("defaults", [])
    if not isinstance(defaults, list):
        raise ConfigError(f"{source}: defaults must be a list, e.g. [ppo_trainer, _self_]")
    entries += defaults
    if "_self_" not in entries:
        entries.append("_self_")  # hydra >= 1.1 places _self_ last unless told otherwise
    merged: dict = {}
    for entry in entries:
        if entry == "_self_":
            merged = deep_merge(merged, data)
        elif isinstance(entry, str):
            merged = deep_merge(merged, _read_tree(_find_config(entry, search), chain))
        else:
            raise ConfigError(
                f"{source}: defaults entry {entry!r} is not supported; "
                "list config names (e.g. ppo_trainer) and _self_"
            )
    return merged


def load_raw(name_or_path: str = DEFAULT_CONFIG) -> dict[str, Any]:
    """Return a preset (name in engine/configs, or a path) as plain data, defaults merged."""
    return _read_tree(_find_config(name_or_path, [CONFIG_DIR]), ())


def load_config(
    name_or_path: str = DEFAULT_CONFIG,
    overrides: list[str] | None = None,
    *,
    all_errors: bool = False,
) -> PPOConfig:
    """Load a preset (a name in engine/configs or a YAML path) and apply dotted overrides.

    ``all_errors``: report every bad override, unknown key and wrong type at once (the CLI); the
    ``ConfigValidationError`` then carries ``config``, built with the bad values left out, so the
    caller can validate the rest too.
    """
    tree, errors = _applied(load_raw(name_or_path), overrides or [], all_errors)
    if not all_errors:
        return config_from_dict(tree)
    data = _resolve_typed_references(apply_aliases(tree))
    config = _from_dict(PPOConfig, data, "", errors)
    if errors:
        failure = ConfigValidationError(errors)
        failure.config = config
        raise failure
    return config
