"""``run_training``: the one call that trains a config, on the controller it names.

``trainer.controller=local`` trains in this process (``PPOTrainer``; on a CUDA device its
workers are FSDP2 ranks of a one-rank group), ``ray`` over Ray worker groups of FSDP2 ranks
(``RayPPOTrainer``); ``actor_rollout_ref.hybrid_engine=False`` trains one batch ahead with a
rollout worker process (``OneStepOffPPOTrainer``), or, with ``async_training.*`` keys set, from
the bounded queue that process streams into (``FullyAsyncPPOTrainer``); under ``ray`` either
loop runs over the Ray worker groups (``engine.trainer.ray_async``). This module knows them all;
the trainers know nothing of each other's choice.
"""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING

from engine.config.async_training import is_fully_async
from engine.trainer.fully_async import FullyAsyncPPOTrainer
from engine.trainer.one_step_off import OneStepOffPPOTrainer
from engine.trainer.ppo_trainer import PPOTrainer
from engine.trainer.ray_async import RayFullyAsyncPPOTrainer, RayOneStepOffPPOTrainer
from engine.trainer.ray_trainer import RayPPOTrainer
from engine.trainer.reporting import Recorder, RunOutcome

if TYPE_CHECKING:
    from engine.config import PPOConfig


def trainer_class(config: PPOConfig) -> type[PPOTrainer]:
    """Return the trainer ``config`` selects: its controller crossed with its loop."""
    on_ray = config.trainer.controller == "ray"
    if is_fully_async(config):
        return RayFullyAsyncPPOTrainer if on_ray else FullyAsyncPPOTrainer
    if not config.actor_rollout_ref.hybrid_engine:
        return RayOneStepOffPPOTrainer if on_ray else OneStepOffPPOTrainer
    return RayPPOTrainer if on_ray else PPOTrainer


def run_training(config: PPOConfig, recorder: Recorder | None = None) -> RunOutcome:
    """Train with ``config``; report to ``recorder``; return the final status.

    ``trainer.controller=ray`` runs the same loop over Ray worker groups of FSDP2 ranks
    (``engine.distributed``). A failure calls ``recorder.on_finish(status="failed",
    error=<traceback>)`` and re-raises.
    """
    trainer: PPOTrainer | None = None
    try:
        # Importing RayPPOTrainer does not import Ray; its worker groups start Ray when built.
        trainer = trainer_class(config)(config, recorder)
        return trainer.fit()
    except BaseException:
        # The trainer's recorder is the caller's plus trainer.logger's sinks; before it exists,
        # only the caller's can be told.
        told = trainer.report if trainer is not None else recorder
        if told is not None:
            told.on_finish(status=RunOutcome.FAILED, error=traceback.format_exc())
        raise
