"""The embedded tiny model, tokenizer and arithmetic task: every path runs on a CPU, offline.

Presets name the assets by URI (``tiny://model``, ``tiny://train.parquet``, ...,
``tiny://reward_model``: a classifier of the task's answers, ``engine.tiny.reward_model``);
``resolve_tiny_path`` turns such a URI into a real path, building the cache on first use.
"""

from __future__ import annotations

from pathlib import Path

from engine.tiny.recipe import (
    RECIPE,
    TinyAssets,
    build_model,
    ensure_tiny_assets,
    greedy_accuracy,
    recipe_hash,
)
from engine.tiny.task import make_problems
from engine.tiny.tokenizer import build_tokenizer

URI_PREFIX = "tiny://"
URI_FIELDS = {
    "model": "model_dir",
    "train.parquet": "train_parquet",
    "val.parquet": "val_parquet",
    "train.jsonl": "train_jsonl",
    "val.jsonl": "val_jsonl",
}
REWARD_MODEL_URI = URI_PREFIX + "reward_model"

__all__ = [
    "RECIPE",
    "TinyAssets",
    "build_model",
    "build_tokenizer",
    "ensure_tiny_assets",
    "greedy_accuracy",
    "make_problems",
    "recipe_hash",
    "resolve_tiny_path",
]


def resolve_tiny_path(path: str, data_dir: Path | None = None) -> str:
    """Return the real path for a ``tiny://<name>`` URI (building if needed); other paths as given."""
    if not path.startswith(URI_PREFIX):
        return path
    if path == REWARD_MODEL_URI:
        from engine.tiny.reward_model import ensure_tiny_reward_model

        return str(ensure_tiny_reward_model(data_dir))
    name = path[len(URI_PREFIX) :]
    if name not in URI_FIELDS:
        valid = ", ".join([*(URI_PREFIX + known for known in URI_FIELDS), REWARD_MODEL_URI])
        raise ValueError(f"unknown embedded asset {path!r}; valid names are: {valid}")
    return str(getattr(ensure_tiny_assets(data_dir), URI_FIELDS[name]))
