"""A run's progress as the run page and the run list show it: step of total, elapsed, ETA, status.

The ETA assumes the remaining steps take as long as the steps this launch has done so far,
measured from ``started_at`` (so it includes the model load, and errs long early in a run); a
resumed run counts from the step it resumed at. One formula serves the server-rendered bar and
the live socket, which recomputes it on every step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone

from webapp.runs.models import ACTIVE_STATUSES


def format_duration(seconds: float | None) -> str:
    """Return ``seconds`` as ``45s``, ``3m 05s`` or ``2h 07m`` (``—`` for None)."""
    if seconds is None:
        return "—"
    total = max(0, round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


@dataclass(frozen=True)
class RunProgress:
    status: str
    latest_step: int
    total_steps: int | None
    percent: float | None
    elapsed_s: float | None
    eta_s: float | None
    text: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_progress(
    *,
    status: str,
    latest_step: int,
    start_step: int,
    total_steps: int | None,
    started_at: datetime | None,
    finished_at: datetime | None,
    now: datetime | None = None,
) -> RunProgress:
    """Return how far a run is: percent of ``total_steps``, elapsed and estimated remaining time."""
    now = now or timezone.now()
    percent = None
    if total_steps:
        percent = round(100.0 * min(latest_step, total_steps) / total_steps, 1)
    elapsed = None
    if started_at is not None:
        elapsed = max(0.0, ((finished_at or now) - started_at).total_seconds())
    eta = None
    done = latest_step - start_step
    if status in ACTIVE_STATUSES and total_steps and elapsed is not None and done > 0:
        eta = elapsed / done * max(0, total_steps - latest_step)
    parts = [f"step {latest_step}" + (f" / {total_steps}" if total_steps else "")]
    if elapsed is not None:
        parts.append(f"{format_duration(elapsed)} elapsed")
    if eta is not None:
        parts.append(f"ETA {format_duration(eta)}")
    parts.append(status)
    return RunProgress(
        status=status,
        latest_step=latest_step,
        total_steps=total_steps,
        percent=percent,
        elapsed_s=None if elapsed is None else round(elapsed, 3),
        eta_s=None if eta is None else round(eta, 3),
        text=" · ".join(parts),
    )


def run_progress_of(run: Any, now: datetime | None = None) -> RunProgress:
    """Return the progress of a ``Run`` row."""
    return run_progress(
        status=run.status,
        latest_step=run.latest_step,
        start_step=run.start_step,
        total_steps=run.total_steps,
        started_at=run.started_at,
        finished_at=run.finished_at,
        now=now,
    )
