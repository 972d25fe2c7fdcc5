"""The role objects the trainer drives keep the interfaces it is typed against."""

from __future__ import annotations

import torch

from engine.distributed.local_group import LocalWorkerGroup
from engine.distributed.worker_group import ActorRolloutRefGroup
from engine.roles.actor_rollout_ref import ActorRolloutRefWorker
from engine.roles.protocols import ActorRolloutRef, Critic, RolloutEngine
from engine.rollout.hf import HFRollout
from tests.engine.distributed.helpers import tiny_config


def test_the_plain_worker_and_a_groups_proxy_are_both_an_actor_rollout_ref(fresh_group):
    config = tiny_config()
    worker = ActorRolloutRefWorker(config, device=torch.device("cpu"), total_steps=2, need_ref=True)
    assert isinstance(worker, ActorRolloutRef)
    assert isinstance(worker.rollout, RolloutEngine) and isinstance(worker.rollout, HFRollout)
    assert not isinstance(worker, Critic)
    proxy = ActorRolloutRefGroup(
        LocalWorkerGroup("cpu"), tiny_config(), total_steps=2, need_ref=True
    )
    assert isinstance(proxy, ActorRolloutRef)
