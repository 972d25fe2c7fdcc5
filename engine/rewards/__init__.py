"""Rewards: rule-based scorers keyed by ``data_source`` (verl's), named rewards, composites,
a reward model and the manager that turns a rollout batch into token-level rewards.

``RewardManager``, ``CompositeReward`` and ``RewardModelScorer`` are imported on first access
(PEP 562): reward worker processes import this package to unpickle a reward function, and the
rule-based scorers need no torch, so importing the package stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from engine.rewards.custom import load_custom_reward_fn
from engine.rewards.default import KNOWN_DATA_SOURCES, default_compute_score
from engine.rewards.registry import get_reward_fn, list_reward_fns, register_reward_fn

if TYPE_CHECKING:
    from engine.rewards.composite import CompositeReward
    from engine.rewards.manager import RewardManager
    from engine.rewards.reward_model import RewardModelScorer

_LAZY = {
    "CompositeReward": "engine.rewards.composite",
    "RewardManager": "engine.rewards.manager",
    "RewardModelScorer": "engine.rewards.reward_model",
}

__all__ = [
    "KNOWN_DATA_SOURCES",
    "CompositeReward",
    "RewardManager",
    "RewardModelScorer",
    "default_compute_score",
    "get_reward_fn",
    "list_reward_fns",
    "load_custom_reward_fn",
    "register_reward_fn",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'engine.rewards' has no attribute {name!r}")
