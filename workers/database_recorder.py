"""``RunRecorder``: the engine's ``Recorder`` that writes a run to PostgreSQL and its live group.

A step is written whole: its samples, its checkpoint and its metrics in one transaction
(``driver_writes.run_record_step``), then its ``samples`` and ``metrics`` events go out. So the
database never shows a step whose samples landed but whose metrics did not.

Failure policy: a database outage (``OperationalError``/``InterfaceError``) never reaches the
trainer. Finished steps wait in :class:`PendingWrites` (memory, then a JSONL file in the run's
folder past a bound) and are written in order, each replacing any partial earlier write of the
same step, once PostgreSQL answers again. The recorder tries again at the next step after a
capped exponential back-off, so training never waits on the database. During an outage
``should_stop`` answers "not cancelled". ``on_finish`` writes what is pending, then the end
state, retrying for up to ``finish_timeout_s`` before it gives up with :class:`RecordingGaveUp`.
Any other database error (a bug, not an outage) is raised. Publishing failures never reach the
trainer.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connection
from django.utils import timezone

from engine.trainer.reporting import Recorder, SampleRecord
from webapp.runs.driver_writes import (
    run_finish,
    run_heartbeat,
    run_record_start,
    run_record_step,
    run_should_stop,
)
from webapp.runs.events import run_event, step_events
from workers.publish import RunEventPublisher

logger = logging.getLogger(__name__)

# The errors of a database that cannot be reached; anything else is a bug and is raised.
OUTAGE_ERRORS = (OperationalError, InterfaceError)
MEMORY_ROWS = 50_000  # sample rows held in memory during an outage before spilling to disk
BACKOFF_MAX_S = 30.0
FINISH_TIMEOUT_S = 1800.0
SPILL_FILE = "pending-writes.jsonl"


class RecordingGaveUp(RuntimeError):
    """The database stayed unreachable past the recorder's finish timeout."""


@dataclass
class StepWrite:
    """What one step records: its samples, checkpoint and metrics (written together)."""

    step: int
    samples: list[SampleRecord] = field(default_factory=list)
    metrics: dict[str, float] | None = None
    wall_time: datetime | None = None
    checkpoint: str | None = None

    def to_json(self) -> str:
        """Return the write as one JSON line (NaN and inf kept as JSON's extensions)."""
        return json.dumps(
            {
                "step": self.step,
                "samples": [s.to_dict() for s in self.samples],
                "metrics": self.metrics,
                "wall_time": self.wall_time.isoformat() if self.wall_time else None,
                "checkpoint": self.checkpoint,
            },
            default=_plain,
        )

    @classmethod
    def from_json(cls, line: str | bytes) -> StepWrite:
        """Return the write that :meth:`to_json` wrote."""
        data = json.loads(line)
        return cls(
            step=data["step"],
            samples=[SampleRecord(**s) for s in data["samples"]],
            metrics=data["metrics"],
            wall_time=datetime.fromisoformat(data["wall_time"]) if data["wall_time"] else None,
            checkpoint=data["checkpoint"],
        )


def _plain(value: Any) -> Any:
    # numpy scalars and 0-d arrays carry .item(); anything else is stored as its text.
    return value.item() if hasattr(value, "item") else str(value)


class PendingWrites:
    """Step writes not yet in the database, oldest first.

    Up to ``memory_rows`` sample rows stay in memory; past that, writes are appended to
    ``spill_path`` (one JSON line each), and keep going there until the file is written out, so
    the order never changes. ``spill_offset`` is how far the file has been written out.
    """

    def __init__(self, spill_path: Path, memory_rows: int = MEMORY_ROWS) -> None:
        self.spill_path = spill_path
        self.memory_rows = memory_rows
        self.memory: deque[StepWrite] = deque()
        self.rows = 0
        self.spilled = 0
        self.spill_offset = 0
        self._next_offset = 0
        spill_path.unlink(missing_ok=True)  # a file of an earlier driver of this run is stale

    def __len__(self) -> int:
        return len(self.memory) + self.spilled

    def push(self, write: StepWrite) -> None:
        """Queue ``write`` after every pending one."""
        if self.spilled or (self.memory and self.rows + len(write.samples) > self.memory_rows):
            self.spill_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.spill_path, "a", encoding="utf-8") as f:
                f.write(write.to_json() + "\n")
            self.spilled += 1
        else:
            self.memory.append(write)
            self.rows += len(write.samples)

    def peek(self) -> StepWrite | None:
        """Return the oldest pending write, or None."""
        if self.memory:
            return self.memory[0]
        if not self.spilled:
            return None
        with open(self.spill_path, "rb") as f:
            f.seek(self.spill_offset)
            line = f.readline()
        self._next_offset = self.spill_offset + len(line)
        return StepWrite.from_json(line)

    def pop(self) -> None:
        """Drop the write :meth:`peek` returned: it is in the database."""
        if self.memory:
            self.rows -= len(self.memory.popleft().samples)
            return
        self.spilled -= 1
        self.spill_offset = self._next_offset
        if not self.spilled:
            self.spill_path.unlink(missing_ok=True)
            self.spill_offset = 0


class RunRecorder(Recorder):
    """Record one run (by id) in the database and publish its events, riding out outages."""

    def __init__(
        self,
        run_id: int,
        publisher: RunEventPublisher | None = None,
        *,
        spill_dir: Path | None = None,
        memory_rows: int = MEMORY_ROWS,
        finish_timeout_s: float = FINISH_TIMEOUT_S,
    ) -> None:
        if spill_dir is None:
            from webapp.runs.models import run_dir

            spill_dir = run_dir(run_id)
        self.run_id = run_id
        self.publisher = publisher
        self.finish_timeout_s = finish_timeout_s
        self.pending = PendingWrites(spill_dir / SPILL_FILE, memory_rows)
        self.open: StepWrite | None = None  # the step being assembled: samples, then metrics
        self.last_metrics_step = -1
        self.start: dict[str, int] | None = None
        self.finished = False
        self.stop_requested = False  # set by the driver's SIGTERM handler
        self.retry_at = 0.0  # time.monotonic() before which the database is not tried again
        self.backoff_s = 0.0
        self.outage_since: float | None = None
        self.last_error = ""

    # -- the database, with back-off -----------------------------------------------------------
    def _attempt(self, write: Callable[[], Any]) -> bool:
        """Call ``write``; return False (and back off) if the database cannot be reached."""
        if time.monotonic() < self.retry_at:
            return False
        try:
            write()
        except OUTAGE_ERRORS as exc:
            self._outage(exc)
            return False
        if self.outage_since is not None:
            logger.warning(
                "run %s: the database answers again after %.0f s; writing %d pending steps",
                self.run_id,
                time.monotonic() - self.outage_since,
                len(self.pending),
            )
            self.outage_since = None
        self.backoff_s = 0.0
        return True

    def _outage(self, exc: Exception) -> None:
        # A broken connection stays broken; the next query opens a new one.
        with contextlib.suppress(DatabaseError):
            connection.close()
        now = time.monotonic()
        self.last_error = f"{type(exc).__name__}: {str(exc).strip()}"
        if self.outage_since is None:
            self.outage_since = now
            logger.warning(
                "run %s: the database is unreachable (%s); training goes on and its steps "
                "wait to be written",
                self.run_id,
                self.last_error,
            )
        self.backoff_s = min(max(1.0, 2 * self.backoff_s), BACKOFF_MAX_S)
        self.retry_at = now + self.backoff_s

    def flush(self, *, drop_broken: bool = False) -> bool:
        """Write what is pending, oldest first; return whether nothing is left.

        With ``drop_broken`` (at the end of a run), a step the database refuses for another
        reason than an outage is logged and dropped, so the end state can still be written.
        """
        if self.start is not None and not self._attempt(self._write_start):
            return False
        while (write := self.pending.peek()) is not None:
            point = None

            def land(write: StepWrite = write) -> None:
                nonlocal point
                point = run_record_step(
                    run_id=self.run_id,
                    step=write.step,
                    samples=write.samples,
                    metrics=write.metrics,
                    wall_time=write.wall_time,
                    checkpoint=write.checkpoint,
                )

            try:
                if not self._attempt(land):
                    return False
            except DatabaseError:
                if not drop_broken:
                    raise
                logger.exception("run %s: step %s is dropped", self.run_id, write.step)
                self.pending.pop()
                continue
            self.pending.pop()
            self._publish_step(write, point)
        return True

    def _write_start(self) -> None:
        assert self.start is not None
        run_record_start(run_id=self.run_id, **self.start)
        run_heartbeat(run_id=self.run_id, step=self.start["start_step"])
        self._publish(
            "status",
            status="running",
            latest_step=self.start["start_step"],
            total_steps=self.start["total_steps"],
        )
        self.start = None

    # -- events --------------------------------------------------------------------------------
    def _publish(self, event: str, **payload: Any) -> None:
        if self.publisher is not None:
            self.publisher.publish(run_event(self.run_id, event, **payload))

    def _publish_step(self, write: StepWrite, point: Any) -> None:
        if self.publisher is not None:
            for message in step_events(
                self.run_id, write.step, write.samples, point, write.checkpoint
            ):
                self.publisher.publish(message)

    # -- the engine's hooks --------------------------------------------------------------------
    def _part(self, step: int) -> StepWrite:
        """Return the step being assembled, starting ``step``'s if another one was open."""
        if self.open is not None and self.open.step != step:
            self._close()
        if self.open is None:
            self.open = StepWrite(step)
        return self.open

    def _close(self) -> None:
        if self.open is not None:
            self.pending.push(self.open)
            self.open = None

    def _after_part(self, step: int) -> None:
        # A part that comes after its step's metrics (the trainer never does this) goes alone.
        if step <= self.last_metrics_step:
            self._close()
            self.flush()

    def on_start(self, *, config: dict[str, Any], total_steps: int, start_step: int) -> None:
        self.start = {"total_steps": total_steps, "start_step": start_step}
        self.flush()

    def on_samples(self, step: int, samples: list[SampleRecord]) -> None:
        if not samples:
            return
        self._part(step).samples.extend(samples)
        self._after_part(step)

    def on_checkpoint(self, step: int, path: str) -> None:
        self._part(step).checkpoint = path
        self._after_part(step)

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        write = self._part(step)
        write.metrics = dict(metrics)
        write.wall_time = timezone.now()
        self.last_metrics_step = max(self.last_metrics_step, step)
        self._close()
        self.flush()

    def should_stop(self) -> bool:
        if self.stop_requested:
            return True
        answer: list[bool] = []
        if not self._attempt(lambda: answer.append(run_should_stop(run_id=self.run_id))):
            return False  # the database cannot say: not cancelled
        return answer[0]

    def on_finish(self, *, status: str, error: str | None = None) -> None:
        if self.finished:
            return
        self.finished = True
        self._close()
        deadline = time.monotonic() + self.finish_timeout_s
        self._until_landed(
            lambda: self.flush(drop_broken=True), deadline, f"{len(self.pending)} pending steps"
        )
        # run_finish publishes the status change itself, as every status service does.
        self._until_landed(
            lambda: self._attempt(
                lambda: run_finish(run_id=self.run_id, status=status, error=error)
            ),
            deadline,
            f"its end state ({status})",
        )

    def _until_landed(self, attempt: Callable[[], bool], deadline: float, what: str) -> None:
        """Call ``attempt`` until it returns True, sleeping out the back-off; give up at deadline."""
        while not attempt():
            left = deadline - time.monotonic()
            if left <= 0:
                raise RecordingGaveUp(
                    f"run {self.run_id}: {what} could not be written: the database stayed "
                    f"unreachable for the recorder's {self.finish_timeout_s:.0f} s finish "
                    f"timeout (last error: {self.last_error}); the run's checkpoints are in its "
                    "folder, resume it once PostgreSQL answers"
                )
            time.sleep(min(max(self.retry_at - time.monotonic(), 0.01), left))
