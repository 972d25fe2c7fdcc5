"""Load ``PPOConfig`` from YAML presets and verl/hydra command-line overrides.

A preset is read as plain YAML; its hydra ``defaults:`` list (or a ``base:`` key) is merged first,
then the overrides are applied to that plain tree, and only then is the tree turned into typed
dataclasses; the overrides (``key=value``, ``+key=value``, ``++key=value``, ``~key``) are read by
``engine.config.overrides``.

``${dotted.key}`` references in string fields stay as written until ``resolve_config``; in typed
fields (a verl file's ``ppo_mini_batch_size: ${actor_rollout_ref.actor.ppo_mini_batch_size}``) they
are resolved while loading, since an int field cannot hold them.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import yaml

from engine.config.aliases import apply_aliases
from engine.config.fields import ConfigError, ConfigFieldError, ConfigValidationError
from engine.config.keys import (
    _accepts_str,
    _fields,
    _from_dict,
    _is_section,
    config_to_dict,
    matches_type,
)
from engine.config.overrides import _applied
from engine.config.schema import PPOConfig
from engine.config.tree import deep_merge
from engine.config.yaml_io import yaml_load

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
DEFAULT_CONFIG = "ppo_trainer.yaml"

_REFERENCE = re.compile(r"\$\{([^${}]*)\}")
# OmegaConf's marker of a value that must be given (``name: ???``): here, no value yet (null).
MISSING = "???"
_SELECT = "oc.select:"


@dataclasses.dataclass(frozen=True)
class Reference:
    """A ``${...}`` reference as verl's files write them, read relative to the key holding it.

    ``${a.b}`` names a key; ``${.b}`` a key of the same section (``..b``: the parent's);
    ``${oc.select:a.b,default}`` gives ``default`` where ``a.b`` is no key.
    """

    key: str
    has_default: bool = False
    default: Any = None

    @classmethod
    def parse(cls, text: str, holder: str) -> Reference:
        """Return the reference ``text`` (between the braces) held by the key ``holder``."""
        has_default, default = False, None
        if text.startswith(_SELECT):
            text, comma, raw = text[len(_SELECT) :].partition(",")
            has_default = bool(comma)
            default = (
                yaml_load(raw, f"the default of ${{{_SELECT}{text}}}") if raw.strip() else None
            )
        text = text.strip()
        dots = len(text) - len(text.lstrip("."))
        if dots:
            section = holder.split(".")[:-dots]
            text = ".".join([*section, text[dots:]])
        return cls(text, has_default, default)


def _resolve_typed_references(data: dict) -> dict:
    """Replace ``${key}`` values of non-string fields by the value that key holds."""
    merged = deep_merge(config_to_dict(PPOConfig()), data)

    def lookup(text: str, key: str, depth: int = 0) -> Any:
        reference = Reference.parse(text, key)
        node: Any = merged
        for part in reference.key.split("."):
            if not isinstance(node, dict) or part not in node:
                if reference.has_default:
                    return reference.default
                raise ConfigFieldError(
                    key, f"${{{text}}}", "refers to no config key; write ${dotted.key}"
                )
            node = node[part]
        match = _REFERENCE.fullmatch(node) if isinstance(node, str) else None
        if match and depth < 20:
            return lookup(match.group(1), reference.key, depth + 1)
        if match:
            raise ConfigFieldError(key, f"${{{text}}}", "circular ${...} reference")
        return None if node == MISSING else node

    def walk(cls: type, node: dict, prefix: str) -> dict:
        out = dict(node)
        for name, value in node.items():
            if name not in _fields(cls):
                continue
            tp, key = _fields(cls)[name][1], prefix + str(name)
            if _is_section(tp) and isinstance(value, str) and _REFERENCE.fullmatch(value):
                value = lookup(_REFERENCE.fullmatch(value).group(1), key)  # a whole section
                if value is None:
                    del out[name]
                    continue
                out[name] = value
            if _is_section(tp) and isinstance(value, dict):
                out[name] = walk(tp, value, key + ".")
            elif value == MISSING and matches_type(None, tp):
                out[name] = None
            elif value == MISSING:
                raise ConfigFieldError(
                    key, value, "the file leaves this key to be given (???); set it"
                )
            elif isinstance(value, str) and not _accepts_str(tp):
                match = _REFERENCE.fullmatch(value)
                out[name] = lookup(match.group(1), key) if match else value
        return out

    return walk(PPOConfig, data, "")


# ---------------------------------------------------------------------------- dict and YAML


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
        raise ConfigError("the YAML must be a mapping of sections (data:, trainer:, ...)")
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
    data = apply_aliases(data, source)  # a tutorial's spellings, checked within this file
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
