"""What a run's driver writes: claiming the start, heartbeats, the end state, metrics, samples.

The Celery task (``workers.tasks``) and the run driver (``workers.driver``, ``workers.database_recorder``)
call these; the user's side of the lifecycle (create, resume, cancel, delete) is
``webapp.runs.services``, which only queues the task. So the chain is services -> tasks ->
recording, and nothing here imports the services.

Status moves only along ``ALLOWED_TRANSITIONS`` and only by conditional updates
(``UPDATE ... WHERE status IN (...)``, see :func:`transition`), so a second delivery of a task,
a cancel racing a start, or a late heartbeat cannot move a run backwards. A step lands whole:
its samples (replacing any of the same step and split, so a retried write never doubles them),
its metrics (upserted on (run, step)) and the run's latest step, in one transaction. So a driver
killed mid-write leaves either the whole step or none of it.

The sweep (:func:`runs_mark_lost`) marks a run lost when its driver is gone: at once when the
driver is a process on this host that no longer lives, or a Ray Job that Ray says ended, else
when its heartbeat is stale. A driver that lives but records no step for long is flagged
stalled (:func:`runs_mark_stalled`), which is not an end state; one that has not heeded a
cancel for that long is stopped, and its run ends cancelled (:func:`runs_stop_unheeded_cancels`);
a driver keeps that rule itself too (:func:`run_cancel_overdue`, from its heartbeat thread), for
the hosts the sweep cannot reach.
"""

from __future__ import annotations

import math
import socket
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.db import connection, transaction
from django.db.models import Q, Value
from django.db.models.functions import Greatest
from django.utils import timezone

from engine.data.preview import json_safe
from engine.trainer.reporting import SampleRecord
from webapp.alerts.services import alerts_on_status, alerts_on_step
from webapp.health.services import health_record_step
from webapp.runs.events import publish_run_event, status_event
from webapp.runs.models import (
    DRIVER_STATUSES,
    EXTERNAL_DRIVER_PREFIX,
    RAY_DRIVER_PREFIX,
    SAMPLE_FIELDS,
    MetricPoint,
    Run,
    RunStatus,
    Sample,
)
from webapp.sweeps.pruning import sweep_prune_on_step

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
    # reports its true end state. An external run's client that comes back (it or the studio
    # restarted) makes it running again (``webapp.external.services``); a studio run never does.
    RunStatus.LOST: frozenset(
        {RunStatus.RUNNING, RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED}
    ),
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
        alerts_on_status(run_id=run_id, status=target)  # an end state's messages; never raises
    return moved


# The key of the advisory lock every start decision takes, so two workers never both take the
# last driver slot.
_START_LOCK = 0x706F7374


def driver_slots_taken() -> int:
    """Return how many runs have a driver (starting or running), on every host.

    An external run runs elsewhere and takes no slot.
    """
    return Run.objects.filter(status__in=DRIVER_STATUSES, experiment__external=False).count()


def run_claim_for_start(*, run_id: int, max_running: int = 0) -> Run | None:
    """Move a queued run to ``starting`` and return it; None when another delivery got it first.

    With ``max_running`` > 0 it is also None while that many runs already have a driver, and for
    a member of a sweep at its concurrency (``webapp.sweeps.slots``): the run stays queued for the
    dispatch sweep to start when a slot frees.
    """
    from webapp.sweeps.slots import sweep_member_may_start

    with transaction.atomic():
        if max_running > 0:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_START_LOCK])
            if driver_slots_taken() >= max_running:
                return None
        if not sweep_member_may_start(run_id=run_id):
            return None
        if not transition(
            run_id, [RunStatus.QUEUED], RunStatus.STARTING, heartbeat_at=timezone.now()
        ):
            return None
    return Run.objects.get(pk=run_id)


def queued_run_ids() -> list[int]:
    """Return the ids of the queued runs, oldest first (the order the sweep starts them in)."""
    return list(
        Run.objects.filter(status=RunStatus.QUEUED)
        .order_by("created_at", "pk")
        .values_list("pk", flat=True)
    )


def run_set_driver(*, run_id: int, driver: str) -> None:
    """Record where the run's driver lives (``pid:<n>`` on this host, or ``ray:<job id>``)."""
    host = socket.gethostname() if driver.startswith("pid:") else ""
    Run.objects.filter(pk=run_id).update(driver=driver, driver_host=host)


def run_mark_running(*, run_id: int) -> Run | None:
    """Move a starting run to ``running`` and return it; None when it is no longer starting."""
    now = timezone.now()
    if not transition(
        run_id, [RunStatus.STARTING], RunStatus.RUNNING, started_at=now, heartbeat_at=now
    ):
        return None
    return Run.objects.get(pk=run_id)


def run_heartbeat(*, run_id: int, step: int | None = None) -> bool:
    """Beat the heartbeat of a running run (and record its step); return False if not running.

    A new step is progress, so it also clears a stall flag. The latest step never moves back: a
    late step (an external client sends steps out of order) leaves it where it is.
    """
    fields: dict[str, Any] = {"heartbeat_at": timezone.now()}
    if step is not None:
        fields.update(latest_step=Greatest("latest_step", Value(step)), stalled_since=None)
    return bool(Run.objects.filter(pk=run_id, status=RunStatus.RUNNING).update(**fields))


def run_should_stop(*, run_id: int) -> bool:
    """Return True when the run's owner asked to cancel it, it is no longer running, or the
    studio stops it (a ``failure_reason``: its rewards keep failing)."""
    row = (
        Run.objects.filter(pk=run_id)
        .values_list("status", "cancel_requested", "failure_reason")
        .first()
    )
    return row is None or row[1] or row[0] != RunStatus.RUNNING or bool(row[2])


def run_record_start(*, run_id: int, total_steps: int, start_step: int) -> None:
    """Record the run's step range as the trainer reports it on start."""
    Run.objects.filter(pk=run_id).update(
        total_steps=total_steps, start_step=start_step, latest_step=start_step
    )


def run_record_checkpoint(*, run_id: int, step: int, path: str) -> None:
    """Record the newest checkpoint of the run."""
    Run.objects.filter(pk=run_id).update(latest_checkpoint=path)


ERROR_TAIL_CHARS = 2000


def error_tail(text: str, limit: int = ERROR_TAIL_CHARS, whole_in: str = "driver.log") -> str:
    """Return the first line and the last lines of ``text`` that fit in about ``limit`` characters.

    A traceback's last lines name the error; its first says it is one. The whole text stays
    where ``whole_in`` says (the driver's log, ``driver.log`` in the run's folder, by default).
    """
    text = text.rstrip()
    if len(text) <= limit:
        return text
    lines = text.splitlines()
    tail: list[str] = []
    size = 0
    for line in reversed(lines[1:]):
        if tail and size + len(line) + 1 > limit:
            break
        tail.insert(0, line)
        size += len(line) + 1
    skipped = len(lines) - 1 - len(tail)
    return "\n".join(
        [lines[0], f"... ({skipped} lines left out; the whole text is in {whole_in})", *tail]
    )


def run_finish(*, run_id: int, status: str, error: str | None = None) -> bool:
    """Set the end state of a run whose driver stops; return False if it had ended already.

    ``error`` is stored as its :func:`error_tail`. A run the studio stopped (a
    ``failure_reason``), or one about to succeed whose every step's rewards failed
    (``reward_failures``), ends failed with the reason instead.
    """
    from webapp.runs.reward_failures import reward_failure_reason

    if status not in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED):
        raise ValueError(f"status={status!r}: a run finishes as succeeded, failed or cancelled")
    row = Run.objects.filter(pk=run_id).values_list("failure_reason", "config").first()
    reason = row[0] if row else ""
    if row and not reason and status == RunStatus.SUCCEEDED:
        reason = reward_failure_reason(run_id=run_id, config=row[1] or {}, whole_run=True) or ""
    if reason and status != RunStatus.FAILED:
        status, error = RunStatus.FAILED, reason
    # A run the sweep marked lost while its driver was alive still gets its true end state.
    return transition(
        run_id,
        (*DRIVER_STATUSES, RunStatus.LOST),
        status,
        finished_at=timezone.now(),
        error=error_tail(error or ""),
        failure_reason=reason,
    )


def local_driver_pid(run: Run) -> int | None:
    """Return the pid of the run's driver when it is a process on this host, else None."""
    if not run.driver.startswith("pid:") or run.driver_host != socket.gethostname():
        return None
    return int(run.driver[4:])


def driver_process_alive(pid: int, run_id: int, module: bytes = b"workers.driver") -> bool:
    """Return whether ``pid`` is a live (not zombie) ``module`` process of ``run_id`` (or of the
    id ``module`` takes: a checkpoint job's)."""
    proc = Path(f"/proc/{pid}")
    try:
        command = (proc / "cmdline").read_bytes().split(b"\0")
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    # A recycled pid belongs to another program; a zombie has exited and awaits its parent.
    return state != "Z" and module in command and str(run_id).encode() in command


def _driver_log_tail(run: Run) -> str:
    log = Path(run.checkpoint_dir).parent / "driver.log" if run.checkpoint_dir else None
    if log is None or not log.is_file():
        return ""
    with open(log, "rb") as f:
        f.seek(max(0, log.stat().st_size - ERROR_TAIL_CHARS))
        tail = f.read().decode("utf-8", "replace").rstrip()
    return "\n\nthe end of its log (driver.log):\n" + tail


def ray_job_id(run: Run) -> str | None:
    """Return the submission id of the run's driver when it is a Ray Job (``ray:<id>``)."""
    if not run.driver.startswith(RAY_DRIVER_PREFIX):
        return None
    return run.driver.removeprefix(RAY_DRIVER_PREFIX)


def runs_mark_lost(
    *,
    timeout_s: float,
    now: datetime | None = None,
    ray_job_end: Callable[[str], str | None] | None = None,
) -> list[int]:
    """Mark ``lost`` every starting or running run whose driver is gone; return their ids.

    A driver that is a process on this host is gone when that process no longer lives (found at
    once); a Ray Job when ``ray_job_end(job_id)`` says how it ended (found at once: a job that
    failed before its driver could record anything, say); any other driver, or a job Ray cannot
    say ended, when its heartbeat is older than ``timeout_s``. A local driver that lives is never
    lost: a database outage may have kept it from beating.
    """
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=timeout_s)
    lost = []
    for run in Run.objects.filter(status__in=DRIVER_STATUSES).only(
        "pk", "driver", "driver_host", "heartbeat_at", "checkpoint_dir"
    ):
        pid = local_driver_pid(run)
        if pid is not None:
            if driver_process_alive(pid, run.pk):
                continue
            extra = Q(driver=run.driver)
            error = (
                f"the driver process (pid {pid}) exited without recording an end state; "
                "resume the run to continue from its last checkpoint" + _driver_log_tail(run)
            )
        elif (job := ray_job_id(run)) and ray_job_end and (ended := ray_job_end(job)):
            extra = Q(driver=run.driver)
            error = (
                f"the driver's Ray Job {job} ended without recording an end state: {ended}\n"
                "resume the run to continue from its last checkpoint"
            )
        elif run.heartbeat_at is not None and run.heartbeat_at < cutoff:
            extra = Q(heartbeat_at__lt=cutoff)
            error = (
                f"no heartbeat from the driver for over {timeout_s:.0f} s; "
                "resume the run to continue from its last checkpoint"
            )
        else:
            continue
        if transition(
            run.pk, DRIVER_STATUSES, RunStatus.LOST, extra=extra, finished_at=now, error=error
        ):
            lost.append(run.pk)
    return lost


STALL_MIN_S = 600.0
STALL_STEP_FACTOR = 10


def stall_after_s(run: Run, points: Sequence[datetime]) -> float:
    """Return how long ``run`` may go without a new step: 10 x its median step time, >= 600 s.

    ``points`` are the wall times of its newest steps, oldest first.
    """
    gaps = [(b - a).total_seconds() for a, b in zip(points, points[1:], strict=False)]
    median = statistics.median(gaps) if gaps else 0.0
    return max(STALL_STEP_FACTOR * median, STALL_MIN_S)


def _recent_step_times(run: Run) -> list[datetime]:
    """Return the wall times of the run's newest 21 steps, oldest first (:func:`stall_after_s`)."""
    points = MetricPoint.objects.filter(run=run).order_by("-step")
    return list(points.values_list("wall_time", flat=True)[:21])[::-1]


def runs_mark_stalled(*, stall_after: float | None, now: datetime | None = None) -> list[int]:
    """Flag running runs that recorded no step for too long; clear the flag of those that did.

    The limit is ``stall_after`` seconds, or :func:`stall_after_s` of each run when None. A
    stalled run is still running (it can be cancelled); return the ids newly flagged.
    """
    now = now or timezone.now()
    flagged = []
    for run in Run.objects.filter(status=RunStatus.RUNNING):
        recent = _recent_step_times(run)
        last = max([*recent, run.started_at or now])
        if run.stalled_since is not None:
            if last > run.stalled_since:
                Run.objects.filter(pk=run.pk).update(stalled_since=None)
            continue
        limit = stall_after if stall_after is not None else stall_after_s(run, recent)
        if (now - last).total_seconds() > limit:
            Run.objects.filter(pk=run.pk, stalled_since=None).update(stalled_since=last)
            publish_status_on_commit(run.pk)
            flagged.append(run.pk)
    return flagged


def cancel_overdue(
    run: Run, *, stall_after: float | None, now: datetime
) -> tuple[float, float] | None:
    """Return ``(waited, limit)`` seconds when ``run``'s driver has not heeded its cancel for
    longer than ``limit``, else None.

    A driver asked to stop (``cancel_requested``) ends the run cancelled after the step it is in.
    One still going ``stall_after`` seconds after the cancel (None: :func:`stall_after_s` of the
    run, 10 median steps and at least 600 s) is hung, or no longer reads the database.
    """
    if not run.cancel_requested or run.cancel_requested_at is None:
        return None
    limit = stall_after if stall_after is not None else stall_after_s(run, _recent_step_times(run))
    waited = (now - run.cancel_requested_at).total_seconds()
    return (waited, limit) if waited > limit else None


def run_end_unheeded_cancel(
    *, run_id: int, waited: float, limit: float, how: str, now: datetime | None = None
) -> bool:
    """End a run whose driver did not heed its cancel as cancelled, saying how it was stopped;
    return False when the run was no longer a driver's to end."""
    error = (
        f"cancelled: the driver had not stopped {waited:.0f} s after the cancel (its limit "
        f"is {limit:.0f} s), so {how}; the step it was in is lost, "
        "the steps and checkpoints before it are kept"
    )
    now = now or timezone.now()
    return transition(run_id, DRIVER_STATUSES, RunStatus.CANCELLED, finished_at=now, error=error)


def run_cancel_overdue(*, run_id: int, stall_after: float | None) -> tuple[float, float] | None:
    """The driver's own check of :func:`cancel_overdue`, one query while no cancel waits."""
    run = (
        Run.objects.filter(pk=run_id, status__in=DRIVER_STATUSES, cancel_requested=True)
        .only("pk", "started_at", "cancel_requested", "cancel_requested_at")
        .first()
    )
    return None if run is None else cancel_overdue(run, stall_after=stall_after, now=timezone.now())


def runs_stop_unheeded_cancels(
    *,
    stall_after: float | None,
    stop_driver: Callable[[Run], str | None],
    now: datetime | None = None,
) -> list[int]:
    """Stop the drivers that have not heeded a cancel for their stall time; return those runs.

    The limit is :func:`cancel_overdue`'s. ``stop_driver(run)`` stops the driver where it runs
    and says how, or returns None where it cannot (a driver process on another host, which stops
    itself by the same rule: ``workers.driver.HeartbeatThread``); a stopped driver's run ends
    cancelled, the reason on its page. A step the driver had recorded stays; the one it was in
    is lost, as with a kill.
    """
    now = now or timezone.now()
    stopped = []
    asked = Run.objects.filter(
        status__in=DRIVER_STATUSES, cancel_requested=True, cancel_requested_at__isnull=False
    ).exclude(driver__startswith=EXTERNAL_DRIVER_PREFIX)  # its client stops it, or refuses to
    for run in asked:
        overdue = cancel_overdue(run, stall_after=stall_after, now=now)
        if overdue is None:
            continue
        how = stop_driver(run)
        if how is None:
            continue
        waited, limit = overdue
        done = run_end_unheeded_cancel(
            run_id=run.pk, waited=waited, limit=limit, how=f"the studio stopped it ({how})", now=now
        )
        if done:
            stopped.append(run.pk)
    return stopped


# -- what a driver records ---------------------------------------------------------------------


def _finite(value: Any) -> float | None:
    if value is None:  # an external client's NaN (JSON has none)
        return None
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
    "jsonb",
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
        None if s.turns is None else json_safe(s.turns),
        [_text(t) for t in s.tokens],
        _floats(s.token_logprobs) or [],
        _floats(s.token_ref_logprobs),
        _floats(s.token_advantages),
    )


def _delete_same_keys(run_id: int, samples: Sequence[SampleRecord]) -> None:
    """Delete the run's rows keyed (step, split, prompt_index, sample_index) as ``samples`` are."""
    table = connection.ops.quote_name(Sample._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {table} AS s USING unnest(%s::int[], %s::varchar[], %s::int[], "
            "%s::int[]) AS k(step, split, prompt_index, sample_index) WHERE s.run_id = %s AND "
            "s.step = k.step AND s.split = k.split AND s.prompt_index = k.prompt_index AND "
            "s.sample_index = k.sample_index",
            [
                [s.step for s in samples],
                [s.split for s in samples],
                [s.prompt_index for s in samples],
                [s.sample_index for s in samples],
                run_id,
            ],
        )


def samples_write(
    *, run_id: int, samples: Sequence[SampleRecord], replace: bool | str = False
) -> int:
    """Append ``samples`` to the run with one COPY; return how many rows were written.

    With ``replace=True``, the run's rows of the same (step, split) pairs go first, in the same
    transaction, so writing a batch again (a retry after a lost connection) never doubles it.
    With ``replace="keys"``, only the rows of the same (step, split, prompt_index, sample_index)
    go: a step may then arrive in several batches (an external run's client sends a large step
    in parts), and any batch sent again replaces its own rows.
    """
    if not samples:
        return 0
    from psycopg.types.json import Jsonb

    fields = {f.name: f.column for f in Sample._meta.concrete_fields}
    columns = ", ".join(connection.ops.quote_name(fields[name]) for name in SAMPLE_COLUMNS)
    table = connection.ops.quote_name(Sample._meta.db_table)
    json_at = SAMPLE_COLUMNS.index("reward_parts")
    turns_at = SAMPLE_COLUMNS.index("turns")
    with transaction.atomic():
        if replace == "keys":
            _delete_same_keys(run_id, samples)
        elif replace:
            keys = Q()
            for step, split in {(s.step, s.split) for s in samples}:
                keys |= Q(step=step, split=split)
            Sample.objects.filter(keys, run_id=run_id).delete()
        with (
            connection.cursor() as cursor,
            cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy,
        ):
            copy.set_types(list(SAMPLE_TYPES))
            for record in samples:
                row = list(_sample_row(run_id, record))
                row[json_at] = Jsonb(row[json_at])
                if row[turns_at] is not None:
                    row[turns_at] = Jsonb(row[turns_at])
                copy.write_row(row)
    return len(samples)


def run_record_step(
    *,
    run_id: int,
    step: int,
    samples: Sequence[SampleRecord] = (),
    metrics: Mapping[str, Any] | None = None,
    wall_time: datetime | None = None,
    checkpoint: str | None = None,
) -> MetricPoint | None:
    """Write one step whole, in one transaction: samples, checkpoint, then metrics and heartbeat.

    Writing the same step again replaces it, so a retry is safe. Return the metric point, or
    None when the step carried no metrics.
    """
    with transaction.atomic():
        samples_write(run_id=run_id, samples=samples, replace=True)
        if checkpoint is not None:
            run_record_checkpoint(run_id=run_id, step=step, path=checkpoint)
        if metrics is None:
            return None
        point = metric_point_upsert(run_id=run_id, step=step, metrics=metrics, wall_time=wall_time)
        health_record_step(run_id=run_id, step=step, metrics=metrics)  # never raises
        alerts_on_step(run_id=run_id, step=step, metrics=metrics)  # never raises
        _stop_if_rewards_keep_failing(run_id=run_id, metrics=metrics)
        sweep_prune_on_step(run_id=run_id, step=step, metrics=metrics)  # never raises
        run_heartbeat(run_id=run_id, step=step)
        return point


def _stop_if_rewards_keep_failing(*, run_id: int, metrics: Mapping[str, Any]) -> None:
    """Give the run its ``failure_reason`` when its rewards failed too often for too long."""
    from webapp.runs.reward_failures import failed_share, reward_failure_reason

    if not failed_share(metrics, 1):  # no reward failed at this step: no streak goes on
        return
    row = Run.objects.filter(pk=run_id, failure_reason="").values_list("config", flat=True)
    config = row.first()
    if config is None:
        return
    reason = reward_failure_reason(run_id=run_id, config=config)
    if reason and Run.objects.filter(pk=run_id, failure_reason="").update(failure_reason=reason):
        publish_status_on_commit(run_id)
