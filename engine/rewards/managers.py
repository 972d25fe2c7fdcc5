"""The reward managers by their verl names (``reward_model.reward_manager``), as verl's registry.

``engine.rewards.names.REWARD_MANAGERS`` lists the names (the config schema reads them without
torch); this maps each to its class, which the trainer builds with the shared settings and
``reward_model.reward_kwargs`` as keyword arguments, as verl's ``load_reward_manager`` does:

- ``naive``: one call per response, ``reward.num_workers`` processes in parallel;
- ``dapo``: naive plus DAPO's overlong penalty, each float score recorded as ``acc``;
- ``prime``: naive in worker processes with a per-sample timeout (``timeout``);
- ``batch``: one call of a batch function for the whole batch;
- ``remote``: the batch posted to a reward service the administrator allows.
"""

from __future__ import annotations

from engine.rewards.batch_manager import BatchRewardManager
from engine.rewards.dapo import DAPORewardManager
from engine.rewards.manager import RewardManager
from engine.rewards.prime import PrimeRewardManager
from engine.rewards.remote import RemoteRewardManager

REWARD_MANAGER_CLASSES: dict[str, type[RewardManager]] = {
    "naive": RewardManager,
    "dapo": DAPORewardManager,
    "prime": PrimeRewardManager,
    "batch": BatchRewardManager,
    "remote": RemoteRewardManager,
}
