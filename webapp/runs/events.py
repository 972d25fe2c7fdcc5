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
import math
from collections.abc import Sequence
from typing import Any

from webapp.runs.models import run_group_name

logger = logging.getLogger(__name__)


def run_event(run_id: int, event: str, **payload: Any) -> dict[str, Any]:
    """Return the group message for one event of a run."""
    return {"type": "run.event", "event": event, "run_id": run_id, **payload}


def samples_event(
    run_id: int, step: int, split: str, count: int, reward_mean: float | None
) -> dict[str, Any]:
    """Return the ``samples`` event: the step's ``count`` samples of ``split`` and their mean."""
    return run_event(
        run_id, "samples", step=step, split=split, count=count, reward_mean=reward_mean
    )


def step_events(
    run_id: int,
    step: int,
    samples: Sequence[Any] = (),
    point: Any = None,
    checkpoint: str | None = None,
) -> list[dict[str, Any]]:
    """Return the events of one written step: a ``samples`` event per split, then ``metrics``.

    ``samples`` are the step's written ``SampleRecord``s (or anything with ``split`` and
    ``reward``), ``point`` its ``MetricPoint`` (None when the write carried no metrics). The
    driver's recorder and the external-run API both send these, so a page cannot tell them apart.
    """
    events = []
    for split in sorted({s.split for s in samples}):
        rewards = [s.reward for s in samples if s.split == split]
        finite = [r for r in rewards if math.isfinite(r)]
        mean = sum(finite) / len(finite) if finite else None
        events.append(samples_event(run_id, step, split, len(rewards), mean))
    if point is not None:
        # The checkpoint rides along: the run page shows it the moment its step lands.
        extra = {"checkpoint": checkpoint} if checkpoint else {}
        events.append(
            run_event(
                run_id,
                "metrics",
                step=step,
                wall_time=point.wall_time.isoformat(),
                metrics=point.metrics,
                **extra,
            )
        )
    return events


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
