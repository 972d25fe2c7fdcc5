"""``RunRecorder``: the engine's ``Recorder`` that writes a run to PostgreSQL and its live group.

Each step: one ``MetricPoint`` (upserted, so a retried step replaces itself), the heartbeat and
latest step, and a ``metrics`` event; each batch of samples: one COPY and a ``samples`` event.
``should_stop`` reads the cancel flag, so a cancel stops the run within one step. Publishing
failures never reach the trainer; database failures do, because a run that cannot record has
nothing to show.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from engine.trainer.recorder import Recorder, SampleRecord
from webapp.runs.events import run_event
from webapp.runs.recording import (
    metric_point_upsert,
    run_finish,
    run_heartbeat,
    run_record_checkpoint,
    run_record_start,
    run_should_stop,
    samples_write,
)
from workers.publish import RunEventPublisher

logger = logging.getLogger(__name__)


class RunRecorder(Recorder):
    """Record one run (by id) in the database and publish its events."""

    def __init__(self, run_id: int, publisher: RunEventPublisher | None = None) -> None:
        self.run_id = run_id
        self.publisher = publisher
        self.finished = False
        self.stop_requested = False  # set by the driver's SIGTERM handler

    def _publish(self, event: str, **payload: Any) -> None:
        if self.publisher is not None:
            self.publisher.publish(run_event(self.run_id, event, **payload))

    def on_start(self, *, config: dict[str, Any], total_steps: int, start_step: int) -> None:
        run_record_start(run_id=self.run_id, total_steps=total_steps, start_step=start_step)
        run_heartbeat(run_id=self.run_id, step=start_step)
        self._publish("status", status="running", latest_step=start_step, total_steps=total_steps)

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        point = metric_point_upsert(run_id=self.run_id, step=step, metrics=metrics)
        run_heartbeat(run_id=self.run_id, step=step)
        self._publish(
            "metrics", step=step, wall_time=point.wall_time.isoformat(), metrics=point.metrics
        )

    def on_samples(self, step: int, samples: list[SampleRecord]) -> None:
        written = samples_write(run_id=self.run_id, samples=samples)
        if not written:
            return
        for split in sorted({s.split for s in samples}):
            rewards = [s.reward for s in samples if s.split == split]
            finite = [r for r in rewards if math.isfinite(r)]
            self._publish(
                "samples",
                step=step,
                split=split,
                count=len(rewards),
                reward_mean=sum(finite) / len(finite) if finite else None,
            )

    def on_checkpoint(self, step: int, path: str) -> None:
        run_record_checkpoint(run_id=self.run_id, step=step, path=path)

    def on_finish(self, *, status: str, error: str | None = None) -> None:
        if self.finished:
            return
        self.finished = True
        # run_finish publishes the status change itself, as every status service does.
        run_finish(run_id=self.run_id, status=status, error=error)

    def should_stop(self) -> bool:
        return self.stop_requested or run_should_stop(run_id=self.run_id)
