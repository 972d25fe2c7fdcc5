"""Rewards: rule-based scorers keyed by ``data_source`` (verl's), named rewards, composites,
a reward model and the manager that turns a rollout batch into token-level rewards.

Everything here is imported on first access (PEP 562): reward worker processes import this
package to unpickle a reward function, and the config schema imports ``engine.rewards.names``
(the registry's names) without loading the scorers, so importing the package stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.rewards.composite import CompositeReward
    from engine.rewards.custom import load_custom_reward_fn
    from engine.rewards.default import KNOWN_DATA_SOURCES, default_compute_score
    from engine.rewards.manager import RewardManager
    from engine.rewards.registry import get_reward_fn, list_reward_fns, register_reward_fn
    from engine.rewards.reward_model import RewardModelScorer

_LAZY = {
    "KNOWN_DATA_SOURCES": "engine.rewards.default",
    "default_compute_score": "engine.rewards.default",
    "get_reward_fn": "engine.rewards.registry",
    "list_reward_fns": "engine.rewards.registry",
    "register_reward_fn": "engine.rewards.registry",
    "load_custom_reward_fn": "engine.rewards.custom",
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
