"""A run's state as its page shows it beside the charts: one snapshot for every reader.

The run page's first paint (``runs/detail.html`` hands it to ``run_summary.js`` as JSON) and
every message of the run's socket (``webapp.runs.consumers``) use :func:`run_state`, so what a
page shows after a reload and what it shows live cannot drift apart.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from webapp.runs.metrics import epoch_seconds
from webapp.runs.models import Run


def _seconds(moment: datetime | None) -> float | None:
    return None if moment is None else epoch_seconds(moment)


def run_state(run: Run) -> dict[str, Any]:
    """Return what the page shows about a run beside its charts (status, steps, times, buttons).

    Times are Unix seconds; ``can_cancel`` shows the cancel button (an external run's only when
    its client stops the job on request), ``can_resume`` the resume one
    (enabled when ``latest_checkpoint`` is set); ``error`` is a failed run's traceback tail
    (``driver_writes.error_tail``, at most about 2,000 characters); ``failure_reason`` why the studio
    stops the run (``reward_failures``), shown while it stops.
    """
    return {
        "id": run.pk,
        "status": run.status,
        "latest_step": run.latest_step,
        "start_step": run.start_step,
        "total_steps": run.total_steps,
        "started_at": _seconds(run.started_at),
        "finished_at": _seconds(run.finished_at),
        "cancel_requested": run.cancel_requested,
        "heartbeat_at": _seconds(run.heartbeat_at),
        "stalled_since": _seconds(run.stalled_since),
        "latest_checkpoint": run.latest_checkpoint,
        "driver": run.driver,
        "is_active": run.is_active,
        "can_cancel": run.can_cancel,
        "can_resume": run.can_resume,
        "error": run.error,
        "failure_reason": run.failure_reason,
    }
