"""Live events of a run, sent to its Channels group ``run.<id>``.

Every message has ``type: "run.event"`` (a consumer's ``run_event`` handler receives it) and an
``event`` of ``metrics`` (with the step's ``checkpoint`` when it saved one), ``samples``,
``status``, ``heartbeat`` (the driver's beat during a step; the consumer answers both with the
run's state read afresh), ``health`` (an alert of ``webapp.health``) or ``checkpoints`` (a job
on one of its checkpoints moved, ``webapp.runs.checkpoints``). The driver sends
through a long-lived ``workers.publish.RunEventPublisher`` (its heartbeat thread through one of
its own); the web and Celery processes send their rare status changes with
``publish_run_event``. A failed send is logged and never fails the caller: the
database holds the truth and a page reloads its backlog from there.
"""

from __future__ import annotations

import logging
from typing import Any

from webapp.runs.models import run_group_name

logger = logging.getLogger(__name__)


def run_event(run_id: int, event: str, **payload: Any) -> dict[str, Any]:
    """Return the group message for one event of a run."""
    return {"type": "run.event", "event": event, "run_id": run_id, **payload}


def status_event(run: Any) -> dict[str, Any]:
    """Return the ``status`` message that describes a run's current state."""
    return run_event(
        run.pk,
        "status",
        status=run.status,
        latest_step=run.latest_step,
        total_steps=run.total_steps,
        cancel_requested=run.cancel_requested,
    )


def publish_run_event(message: dict[str, Any]) -> bool:
    """Send ``message`` to its run's group once; return False (and log) when it could not."""
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    try:
        layer = get_channel_layer()
        if layer is None:
            return False
        async_to_sync(layer.group_send)(run_group_name(message["run_id"]), message)
        return True
    except Exception:
        logger.warning(
            "could not publish %s event of run %s",
            message.get("event"),
            message.get("run_id"),
            exc_info=True,
        )
        return False
