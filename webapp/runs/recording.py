"""What a run's driver writes: claiming the start, heartbeats, the end state, metrics, samples.

The Celery task (``workers.tasks``) and the run driver (``workers.driver``, ``workers.recorder``)
call these; the user's side of the lifecycle (create, resume, cancel, delete) is
``webapp.runs.services``, which only queues the task. So the chain is services -> tasks ->
recording, and nothing here imports the services.

Status moves only along ``ALLOWED_TRANSITIONS`` and only by conditional updates
(``UPDATE ... WHERE status IN (...)``, see :func:`transition`), so a second delivery of a task,
a cancel racing a start, or a late heartbeat cannot move a run backwards. Metrics are upserted
on (run, step) so a retried step overwrites itself; samples are appended with COPY.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from engine.data.preview import json_safe
from engine.trainer.recorder import SampleRecord
from webapp.runs.events import publish_run_event, status_event
from webapp.runs.models import (
    DRIVER_STATUSES,
    SAMPLE_FIELDS,
    MetricPoint,
    Run,
    RunStatus,
    Sample,
)

# Every status change a run may make; anything else is a bug, refused by ``transition``.
ALLOWED_TRANSITIONS: dict[str, frozenset[str]] = {
    RunStatus.QUEUED: frozenset({RunStatus.STARTING, RunStatus.CANCELLED, RunStatus.FAILED}),
    RunStatus.STARTING: frozenset(
        {
            RunStatus.RUNNING,
            RunStatus.SUCCEEDED,
            RunStatus.FAILED,
            RunStatus.CANCELLED,
            RunStatus.LOST,
        }
    ),
    RunStatus.RUNNING: frozenset(
        {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.LOST}
    ),
    # The sweep marks a run lost when its heartbeat stops; a driver that was only slow still
    # reports its true end state.
    RunStatus.LOST: frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED}),
    RunStatus.SUCCEEDED: frozenset(),
    RunStatus.FAILED: frozenset(),
    RunStatus.CANCELLED: frozenset(),
}


def publish_status_on_commit(run_id: int) -> None:
    """Send the run's status to its page's socket once the transaction commits."""

    def send() -> None:
        run = Run.objects.filter(pk=run_id).first()
        if run is not None:
            publish_run_event(status_event(run))

    transaction.on_commit(send)


def transition(
    run_id: int, sources: Iterable[str], target: str, *, extra: Any = None, **fields: Any
) -> bool:
    """Move the run from any of ``sources`` to ``target`` if it is in one; return whether it moved.

    The update is conditional on the current status, so of two racing callers exactly one
    moves the run. ``extra`` is a Q filter the row must also match; ``fields`` are set with the
    status. ValueError for a change ``ALLOWED_TRANSITIONS`` does not list.
    """
    sources = tuple(sources)
    refused = [s for s in sources if target not in ALLOWED_TRANSITIONS[s]]
    if refused:
        raise ValueError(f"a run does not move from {', '.join(refused)} to {target}")
    rows = Run.objects.filter(pk=run_id, status__in=sources)
    if extra is not None:
        rows = rows.filter(extra)
    moved = bool(rows.update(status=target, **fields))
    if moved:
        publish_status_on_commit(run_id)
    return moved


def run_claim_for_start(*, run_id: int) -> Run | None:
    """Move a queued run to ``starting`` and return it; None when another delivery got it first."""
    if not transition(run_id, [RunStatus.QUEUED], RunStatus.STARTING, heartbeat_at=timezone.now()):
        return None
    return Run.objects.get(pk=run_id)


def run_set_driver(*, run_id: int, driver: str) -> None:
    """Record where the run's driver lives (``pid:<n>`` or ``ray:<job id>``)."""
    Run.objects.filter(pk=run_id).update(driver=driver)


def run_mark_running(*, run_id: int) -> Run | None:
    """Move a starting run to ``running`` and return it; None when it is no longer starting."""
    now = timezone.now()
    if not transition(
        run_id, [RunStatus.STARTING], RunStatus.RUNNING, started_at=now, heartbeat_at=now
    ):
        return None
    return Run.objects.get(pk=run_id)


def run_heartbeat(*, run_id: int, step: int | None = None) -> bool:
    """Beat the heartbeat of a running run (and record its step); return False if not running."""
    fields: dict[str, Any] = {"heartbeat_at": timezone.now()}
    if step is not None:
        fields["latest_step"] = step
    return bool(Run.objects.filter(pk=run_id, status=RunStatus.RUNNING).update(**fields))


def run_should_stop(*, run_id: int) -> bool:
    """Return True when the run's owner asked to cancel it or it is no longer running."""
    row = Run.objects.filter(pk=run_id).values_list("status", "cancel_requested").first()
    return row is None or row[1] or row[0] != RunStatus.RUNNING


def run_record_start(*, run_id: int, total_steps: int, start_step: int) -> None:
    """Record the run's step range as the trainer reports it on start."""
    Run.objects.filter(pk=run_id).update(
        total_steps=total_steps, start_step=start_step, latest_step=start_step
    )


def run_record_checkpoint(*, run_id: int, step: int, path: str) -> None:
    """Record the newest checkpoint of the run."""
    Run.objects.filter(pk=run_id).update(latest_checkpoint=path)


def run_finish(*, run_id: int, status: str, error: str | None = None) -> bool:
    """Set the end state of a run whose driver stops; return False if it had ended already."""
    if status not in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED):
        raise ValueError(f"status={status!r}: a run finishes as succeeded, failed or cancelled")
    # A run the sweep marked lost while its driver was alive still gets its true end state.
    return transition(
        run_id,
        (*DRIVER_STATUSES, RunStatus.LOST),
        status,
        finished_at=timezone.now(),
        error=error or "",
    )


def runs_mark_lost(*, timeout_s: float, now: datetime | None = None) -> list[int]:
    """Mark ``lost`` every starting or running run whose heartbeat is older than ``timeout_s``."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=timeout_s)
    lost = []
    stale = Run.objects.filter(status__in=DRIVER_STATUSES, heartbeat_at__lt=cutoff)
    for run_id in stale.values_list("pk", flat=True):
        marked = transition(
            run_id,
            DRIVER_STATUSES,
            RunStatus.LOST,
            extra=Q(heartbeat_at__lt=cutoff),
            finished_at=now,
            error=f"no heartbeat from the driver for over {timeout_s:.0f} s; "
            "resume the run to continue from its last checkpoint",
        )
        if marked:
            lost.append(run_id)
    return lost


# -- what a driver records ---------------------------------------------------------------------


def _finite(value: Any) -> float | None:
    number = float(value)
    return number if math.isfinite(number) else None


def metric_point_upsert(
    *, run_id: int, step: int, metrics: Mapping[str, Any], wall_time: datetime | None = None
) -> MetricPoint:
    """Store the metrics of one step; a second call for the same step replaces the first.

    Non-finite values (NaN, inf) are stored as null, which JSON can hold.
    """
    point = MetricPoint(
        run_id=run_id,
        step=step,
        wall_time=wall_time or timezone.now(),
        metrics={str(k): _finite(v) for k, v in metrics.items()},
    )
    MetricPoint.objects.bulk_create(
        [point],
        update_conflicts=True,
        unique_fields=["run", "step"],
        update_fields=["wall_time", "metrics"],
    )
    return point


SAMPLE_COLUMNS = ("run", *SAMPLE_FIELDS)
# The PostgreSQL type of each column, for binary COPY (same order).
SAMPLE_TYPES = (
    "bigint",
    "integer",
    "varchar",
    "integer",
    "integer",
    "varchar",
    "varchar",
    "text",
    "text",
    "text",
    "float8",
    "jsonb",
    "text",
    "float8",
    "integer",
    "bool",
    "text[]",
    "float4[]",
    "float4[]",
    "float4[]",
)


def _text(value: str | None) -> str | None:
    # PostgreSQL text cannot hold NUL; a model can emit one.
    return None if value is None else str(value).replace("\x00", "\ufffd")


def _floats(values: Iterable[float] | None) -> list[float] | None:
    return None if values is None else [float(v) for v in values]


def _sample_row(run_id: int, s: SampleRecord) -> tuple[Any, ...]:
    return (
        run_id,
        s.step,
        s.split,
        s.prompt_index,
        s.sample_index,
        _text(s.group_id) or "",
        _text(s.data_source) or "",
        _text(s.prompt_text),
        _text(s.response_text),
        _text(s.ground_truth),
        float(s.reward),
        json_safe(s.reward_parts or {}),
        _text(s.reward_error),
        None if s.advantage is None else float(s.advantage),
        s.response_length,
        bool(s.truncated),
        [_text(t) for t in s.tokens],
        _floats(s.token_logprobs) or [],
        _floats(s.token_ref_logprobs),
        _floats(s.token_advantages),
    )


def samples_write(*, run_id: int, samples: Sequence[SampleRecord]) -> int:
    """Append ``samples`` to the run with one COPY; return how many rows were written."""
    if not samples:
        return 0
    from psycopg.types.json import Jsonb

    fields = {f.name: f.column for f in Sample._meta.concrete_fields}
    columns = ", ".join(connection.ops.quote_name(fields[name]) for name in SAMPLE_COLUMNS)
    table = connection.ops.quote_name(Sample._meta.db_table)
    json_at = SAMPLE_COLUMNS.index("reward_parts")
    with (
        transaction.atomic(),
        connection.cursor() as cursor,
        cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy,
    ):
        copy.set_types(list(SAMPLE_TYPES))
        for record in samples:
            row = list(_sample_row(run_id, record))
            row[json_at] = Jsonb(row[json_at])
            copy.write_row(row)
    return len(samples)
