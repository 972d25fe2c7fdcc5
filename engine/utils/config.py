"""``load_config_from_yaml``: a YAML file as a typed ``PPOConfig`` (the tutorials' name)."""

from __future__ import annotations

from pathlib import Path

from engine.config import PPOConfig, load_config


def load_config_from_yaml(path: str | Path) -> PPOConfig:
    """Return the config in the YAML file at ``path``, tutorial spellings translated.

    The file may name presets in ``defaults:``; keys it does not set keep verl's defaults.
    Aliases such as ``algorithm.name`` or ``trainer.total_steps`` become verl's keys, each
    with a note (``engine.config.aliases``).
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"no config file at {path}; give the path of a YAML file")
    return load_config(str(path))
