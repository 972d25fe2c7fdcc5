"""The single-controller PPO/GRPO trainer and the recorder interface it reports through.

``PPOTrainer`` and ``run_training`` are imported lazily so that importing the recorder interface
(the web driver does) does not load torch models.
"""

from typing import Any

from engine.trainer.reporting import (
    CompositeRecorder,
    ConsoleRecorder,
    JsonlRecorder,
    Recorder,
    SampleRecord,
)

__all__ = [
    "CompositeRecorder",
    "ConsoleRecorder",
    "JsonlRecorder",
    "PPOTrainer",
    "Recorder",
    "SampleRecord",
    "run_training",
]


def __getattr__(name: str) -> Any:
    if name == "PPOTrainer":
        from engine.trainer.ppo_trainer import PPOTrainer

        return PPOTrainer
    if name == "run_training":
        from engine.trainer.run import run_training

        return run_training
    raise AttributeError(f"module 'engine.trainer' has no attribute {name!r}")
