"""The single-controller PPO/GRPO trainer and the recorder interface it reports through."""

from engine.trainer.recorder import (
    CompositeRecorder,
    ConsoleRecorder,
    JsonlRecorder,
    Recorder,
    SampleRecord,
)

__all__ = ["CompositeRecorder", "ConsoleRecorder", "JsonlRecorder", "Recorder", "SampleRecord"]
