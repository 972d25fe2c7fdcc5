"""The recorder the engine's benchmark arms time their steps with.

Import it inside the arm: its base class loads the engine's trainer, and the arms measure their
memory after their own imports."""

from __future__ import annotations

import time
from typing import Any

from engine.trainer.reporting import Recorder


class StepClock(Recorder):
    """Record the wall and CPU seconds between the ends of consecutive steps, and each step's
    metrics. ``after_step`` runs between a step and the next one's clock; when it returns True
    its time is counted in neither."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.metrics: list[dict[str, float]] = []
        self.previous = (time.perf_counter(), time.process_time())

    def on_start(self, **_: Any) -> None:
        self.previous = (time.perf_counter(), time.process_time())

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        now = (time.perf_counter(), time.process_time())
        self.wall.append(now[0] - self.previous[0])
        self.cpu.append(now[1] - self.previous[1])
        self.metrics.append(dict(metrics))
        if self.after_step(step):
            now = (time.perf_counter(), time.process_time())
        self.previous = now

    def after_step(self, step: int) -> bool:
        return False
