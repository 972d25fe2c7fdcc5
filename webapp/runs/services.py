"""Write operations on runs: the lifecycle and what a running driver records.

Status moves by conditional updates (``UPDATE ... WHERE status = ...``), so a second delivery of
a task, a cancel racing a start, or a late heartbeat cannot move a run backwards. Metrics are
upserted on (run, step) so a retried step overwrites itself; samples are appended with COPY.
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max
from django.utils import timezone

from engine.config import PPOConfig, config_to_dict, set_value
from engine.data.preview import json_safe
from engine.trainer.recorder import SampleRecord
from webapp.experiments.configs import as_config, config_check
from webapp.experiments.models import Experiment
from webapp.runs.events import publish_run_event, status_event
from webapp.runs.models import (
    ACTIVE_STATUSES,
    DRIVER_STATUSES,
    RESUMABLE_STATUSES,
    MetricPoint,
    Run,
    RunStatus,
    Sample,
)
from webapp.runs.selectors import run_latest_checkpoint

logger = logging.getLogger(__name__)


class RunStateError(Exception):
    """The run is not in a state that allows the action; the message says what would."""


def run_dir(run_id: int) -> Path:
    """Return the folder of a run's files: ``<POSTTRAIN_DATA_DIR>/runs/<id>``."""
    return Path(settings.POSTTRAIN_DATA_DIR).expanduser() / "runs" / str(run_id)


def _move_aside(folder: Path) -> None:
    """Rename a folder left by an earlier database's run of the same id, so nothing mixes in."""
    if folder.exists():
        target = folder.with_name(f"{folder.name}.orphaned-{time.time_ns()}")
        logger.warning("run folder %s exists from an earlier database; moved to %s", folder, target)
        folder.rename(target)


def _publish_status_on_commit(run_id: int) -> None:
    def send() -> None:
        run = Run.objects.filter(pk=run_id).first()
        if run is not None:
            publish_run_event(status_event(run))

    transaction.on_commit(send)


def _dispatch_start(run_id: int) -> None:
    from workers.tasks import start_run

    try:
        start_run.delay(run_id)
    except Exception as exc:
        # Without a broker the run would wait forever; end it with the reason instead.
        logger.exception("could not queue the start of run %s", run_id)
        Run.objects.filter(pk=run_id, status=RunStatus.QUEUED).update(
            status=RunStatus.FAILED,
            finished_at=timezone.now(),
            error=f"the task broker did not take the start request ({type(exc).__name__}); "
            "check that Redis (REDIS_URL) answers, then launch the experiment again",
        )


def run_create(
    *,
    experiment: Experiment,
    config: PPOConfig | dict[str, Any] | None = None,
    parent: Run | None = None,
) -> Run:
    """Queue a new run of ``experiment`` and start it through Celery once the transaction commits.

    ``config`` defaults to the experiment's; it is validated by the engine (``ConfigValidationError``
    otherwise, and nothing is created). The run gets its own checkpoint folder; a run without a
    ``parent`` starts fresh (``resume_mode=disable``: a run never restarts in place, a resume is a
    new run), a resumed one keeps the resume settings ``run_resume`` put in.
    """
    cfg = as_config(experiment.config if config is None else config)
    if parent is None:
        set_value(cfg, "trainer.resume_mode", "disable")
        set_value(cfg, "trainer.resume_from_path", None)
    config_check(owner=experiment.owner, config=cfg)
    with transaction.atomic():
        Experiment.objects.select_for_update().filter(pk=experiment.pk).first()
        last = experiment.runs.aggregate(last=Max("number"))["last"] or 0
        run = Run.objects.create(
            experiment=experiment,
            owner=experiment.owner,
            number=last + 1,
            parent=parent,
            status=RunStatus.QUEUED,
            config={},
        )
        _move_aside(run_dir(run.pk))
        checkpoints = run_dir(run.pk) / "checkpoints"
        set_value(cfg, "trainer.default_local_dir", str(checkpoints))
        run.config = config_to_dict(cfg)
        run.checkpoint_dir = str(checkpoints)
        run.save(update_fields=["config", "checkpoint_dir"])
        Experiment.objects.filter(pk=experiment.pk).update(updated_at=timezone.now())
        transaction.on_commit(partial(_dispatch_start, run.pk))
        _publish_status_on_commit(run.pk)
    return run


def run_resume(*, run: Run) -> Run:
    """Queue a new run that continues ``run`` from its last checkpoint (step numbers continue).

    Raise ``RunStateError`` unless the run was cancelled, failed or lost and saved a checkpoint.
    """
    if run.status not in RESUMABLE_STATUSES:
        raise RunStateError(
            f"run #{run.number} is {run.status}; only a cancelled, failed or lost run resumes"
        )
    checkpoint = run_latest_checkpoint(run=run)
    if checkpoint is None:
        raise RunStateError(
            f"run #{run.number} saved no checkpoint to resume from; launch it again instead "
            "(trainer.save_freq sets how often a run saves one)"
        )
    cfg = as_config(run.config)
    set_value(cfg, "trainer.resume_mode", "resume_path")
    set_value(cfg, "trainer.resume_from_path", str(checkpoint))
    return run_create(experiment=run.experiment, config=cfg, parent=run)


def run_cancel(*, run: Run) -> Run:
    """Cancel ``run``: a queued run ends now; a starting or running one stops after its step."""
    now = timezone.now()
    with transaction.atomic():
        ended = Run.objects.filter(pk=run.pk, status=RunStatus.QUEUED).update(
            status=RunStatus.CANCELLED, cancel_requested=True, finished_at=now
        )
        if not ended:
            Run.objects.filter(pk=run.pk, status__in=DRIVER_STATUSES).update(cancel_requested=True)
        _publish_status_on_commit(run.pk)
    run.refresh_from_db()
    return run


def run_delete(*, run: Run) -> None:
    """Delete a finished run with its metrics, samples and checkpoint folder.

    Raise ``RunStateError`` while it is active: cancel it first.
    """
    if run.status in ACTIVE_STATUSES:
        raise RunStateError(f"run #{run.number} is {run.status}; cancel it before deleting it")
    folder = run_dir(run.pk)
    run.delete()
    shutil.rmtree(folder, ignore_errors=True)


# -- the Celery task and the driver ------------------------------------------------------------


def run_claim_for_start(*, run_id: int) -> Run | None:
    """Move a queued run to ``starting`` and return it; None when another delivery got it first."""
    claimed = Run.objects.filter(pk=run_id, status=RunStatus.QUEUED).update(
        status=RunStatus.STARTING, heartbeat_at=timezone.now()
    )
    if not claimed:
        return None
    _publish_status_on_commit(run_id)
    return Run.objects.get(pk=run_id)


def run_set_driver(*, run_id: int, driver: str) -> None:
    """Record where the run's driver lives (``pid:<n>`` or ``ray:<job id>``)."""
    Run.objects.filter(pk=run_id).update(driver=driver)


def run_mark_running(*, run_id: int) -> Run | None:
    """Move a starting run to ``running`` and return it; None when it is no longer starting."""
    now = timezone.now()
    moved = Run.objects.filter(pk=run_id, status=RunStatus.STARTING).update(
        status=RunStatus.RUNNING, started_at=now, heartbeat_at=now
    )
    if not moved:
        return None
    _publish_status_on_commit(run_id)
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
    ended = Run.objects.filter(pk=run_id, status__in=(*DRIVER_STATUSES, RunStatus.LOST)).update(
        status=status, finished_at=timezone.now(), error=error or ""
    )
    if ended:
        _publish_status_on_commit(run_id)
    return bool(ended)


def runs_mark_lost(*, timeout_s: float, now: datetime | None = None) -> list[int]:
    """Mark ``lost`` every starting or running run whose heartbeat is older than ``timeout_s``."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=timeout_s)
    lost = []
    stale = Run.objects.filter(status__in=DRIVER_STATUSES, heartbeat_at__lt=cutoff)
    for run_id in stale.values_list("pk", flat=True):
        marked = Run.objects.filter(
            pk=run_id, status__in=DRIVER_STATUSES, heartbeat_at__lt=cutoff
        ).update(
            status=RunStatus.LOST,
            finished_at=now,
            error=f"no heartbeat from the driver for over {timeout_s:.0f} s; "
            "resume the run to continue from its last checkpoint",
        )
        if marked:
            lost.append(run_id)
            _publish_status_on_commit(run_id)
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


SAMPLE_COLUMNS = (
    "run",
    "step",
    "split",
    "prompt_index",
    "sample_index",
    "group_id",
    "data_source",
    "prompt_text",
    "response_text",
    "ground_truth",
    "reward",
    "reward_parts",
    "reward_error",
    "advantage",
    "response_length",
    "truncated",
    "tokens",
    "token_logprobs",
    "token_ref_logprobs",
    "token_advantages",
)
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
