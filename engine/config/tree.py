"""Plain config trees (nested dicts, as YAML reads them): look up, set and merge by dotted path.

The loader applies presets and overrides to these trees, and the alias table rewrites them,
before anything becomes a typed ``PPOConfig``.
"""

from __future__ import annotations

import copy
from typing import Any


def deep_merge(base: dict, over: dict) -> dict:
    """Return ``base`` with ``over`` merged in; nested mappings merge, other values replace."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def get_in(tree: Any, parts: list[str]) -> tuple[bool, Any]:
    """Return ``(found, value)`` at the path ``parts`` of ``tree``."""
    for part in parts:
        if not isinstance(tree, dict) or part not in tree:
            return False, None
        tree = tree[part]
    return True, tree


def put(tree: dict, parts: list[str], value: Any) -> None:
    """Set ``value`` at ``parts``, making the sections on the way; a mapping merges into one."""
    for part in parts[:-1]:
        if not isinstance(tree.get(part), dict):
            tree[part] = {}
        tree = tree[part]
    if isinstance(value, dict) and isinstance(tree.get(parts[-1]), dict):
        tree[parts[-1]] = deep_merge(tree[parts[-1]], value)
    else:
        tree[parts[-1]] = copy.deepcopy(value)


def expand_dotted_keys(data: dict) -> dict:
    """Return ``data`` with its top-level dotted keys nested: ``algorithm.adv_estimator: grpo``
    becomes ``algorithm: {adv_estimator: grpo}``, merged with the ``algorithm:`` section if the
    file has one too (verl users write YAML in both spellings)."""
    out: dict = {}
    for key, value in data.items():
        if isinstance(key, str) and "." in key and not key.startswith("."):
            put(out, key.split("."), value)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out
