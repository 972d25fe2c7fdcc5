"""A run's checkpoints on its page: the list, the Hugging Face folder as a streamed archive, and
the work a member asks for on a checkpoint (export, evaluate), done by a worker process.

A checkpoint (``global_step_<N>`` in the run's checkpoint folder, ``engine.trainer.checkpoint``)
holds a Hugging Face folder when the run saved one (``checkpoint.save_contents`` with
``hf_model``: ``actor/huggingface``). Otherwise an *export* job writes one with the model merger
into the run's folder (``exports/global_step_<N>``, marked complete by ``.complete`` once every
file is written). An *evaluate* job scores that folder with ``engine.eval`` on the run's own
validation or training files or one of the asking member's own datasets, with the run's prompt and response
lengths, and keeps the figures beside the run (``CheckpointJob.result``).

Neither runs in the web process: a job is a row, queued here; the workers' periodic
``dispatch_checkpoint_jobs`` starts a ``python -m workers.checkpoint_job <id>`` process for each,
at most ``POSTTRAIN_MAX_CHECKPOINT_JOBS`` at once, and fails a job whose process died. Every
status change is conditional on the status it leaves, as a run's are, and tells the run's page.

The archive is a tar written as it is sent: each file's header, then its bytes in 1 MiB pieces,
so a many-GiB model folder streams without being held in memory or on disk twice. Only regular
files go in; a link is left out, so the archive holds nothing from outside the folder.
"""

from __future__ import annotations

import socket
import tarfile
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from engine.trainer.checkpoint import HF_FOLDER, saved_steps, step_dir
from webapp.runs.events import publish_run_event, run_event
from webapp.runs.models import CheckpointJob, CheckpointJobKind, CheckpointJobStatus, Run

EXPORTS_FOLDER = "exports"
COMPLETE_FILE = ".complete"
ARCHIVE_PIECE_BYTES = 1 << 20
MAX_ACTIVE_JOBS_PER_USER = 4
N_MAX = 64  # samples per prompt an evaluation may ask for
ACTIVE_JOB_STATUSES = (CheckpointJobStatus.QUEUED, CheckpointJobStatus.RUNNING)


class CheckpointJobRefused(ValueError):
    """The job cannot be queued; the message says why and what to do instead."""


def run_folder(run: Run) -> Path:
    """Return the run's folder: the parent of its checkpoint folder."""
    return Path(run.checkpoint_dir).parent


def export_folder(run: Run, step: int) -> Path:
    """Return where an export job writes the Hugging Face folder of ``step``."""
    return run_folder(run) / EXPORTS_FOLDER / f"global_step_{step}"


def job_log_path(job: CheckpointJob) -> Path:
    """Return the output file of a job's process."""
    return run_folder(job.run) / EXPORTS_FOLDER / f"job-{job.pk}.log"


def checkpoint_steps(run: Run) -> list[int]:
    """Return the steps of the run's complete checkpoints, oldest first."""
    return saved_steps(run.checkpoint_dir) if run.checkpoint_dir else []


def checkpoint_hf_folder(run: Run, step: int) -> Path | None:
    """Return the Hugging Face folder of the checkpoint at ``step``: the one the run saved, else
    a finished export; None when there is neither."""
    own = step_dir(run.checkpoint_dir, step) / "actor" / HF_FOLDER
    if (own / "config.json").is_file():
        return own
    exported = export_folder(run, step)
    return exported if (exported / COMPLETE_FILE).is_file() else None


@dataclass
class CheckpointRow:
    """One checkpoint as the run page lists it, with the jobs asked for on it, newest first."""

    step: int
    path: Path
    hf_folder: Path | None
    jobs: list[CheckpointJob] = field(default_factory=list)

    @property
    def exporting(self) -> CheckpointJob | None:
        """Return the export job that is queued or running, if any."""
        return next(
            (j for j in self.jobs if j.kind == CheckpointJobKind.EXPORT and j.is_active), None
        )

    @property
    def evaluations(self) -> list[CheckpointJob]:
        return [j for j in self.jobs if j.kind == CheckpointJobKind.EVALUATE]

    @property
    def failed_export(self) -> CheckpointJob | None:
        """Return the newest export job when it failed (and no folder came of another)."""
        exports = [j for j in self.jobs if j.kind == CheckpointJobKind.EXPORT]
        if self.hf_folder is None and exports and exports[0].status == CheckpointJobStatus.FAILED:
            return exports[0]
        return None


def run_checkpoints(*, run: Run) -> list[CheckpointRow]:
    """Return the run's complete checkpoints, newest first, each with its jobs."""
    jobs: dict[int, list[CheckpointJob]] = {}
    for job in run.checkpoint_jobs.order_by("-created_at", "-pk"):
        jobs.setdefault(job.step, []).append(job)
    return [
        CheckpointRow(
            step=step,
            path=step_dir(run.checkpoint_dir, step),
            hf_folder=checkpoint_hf_folder(run, step),
            jobs=jobs.get(step, []),
        )
        for step in reversed(checkpoint_steps(run))
    ]


def archive_chunks(folder: Path, prefix: str) -> Iterator[bytes]:
    """Yield a tar of ``folder``'s regular files under ``prefix/``, as it is written."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
    for path in files:
        if any(part.is_symlink() for part in path.relative_to(folder).parents if part != Path()):
            continue  # a file reached through a linked folder is outside the folder
        stat = path.stat()
        info = tarfile.TarInfo(f"{prefix}/{path.relative_to(folder).as_posix()}")
        info.size, info.mtime, info.mode = stat.st_size, int(stat.st_mtime), 0o644
        yield info.tobuf(format=tarfile.PAX_FORMAT)
        sent = 0
        with open(path, "rb") as f:
            while piece := f.read(min(ARCHIVE_PIECE_BYTES, info.size - sent)):
                sent += len(piece)
                yield piece
        if sent != info.size:  # the file changed while it was sent: a short archive, not a lie
            raise OSError(f"{path} changed size while it was archived")
        if info.size % tarfile.BLOCKSIZE:
            yield tarfile.NUL * (tarfile.BLOCKSIZE - info.size % tarfile.BLOCKSIZE)
    yield tarfile.NUL * (2 * tarfile.BLOCKSIZE)


# -- what a member asks for --------------------------------------------------------------------


def _publish_on_commit(run_id: int) -> None:
    transaction.on_commit(lambda: publish_run_event(run_event(run_id, "checkpoints")))


def _check_can_queue(run: Run, step: int, by: Any) -> None:
    """Refuse a step with no checkpoint, and a member with ``MAX_ACTIVE_JOBS_PER_USER`` jobs
    waiting or running: the jobs they asked for, on any run, whoever launched it."""
    if step not in checkpoint_steps(run):
        raise CheckpointJobRefused(
            f"run #{run.pk} has no complete checkpoint at step {step}; pick one of its list"
        )
    active = CheckpointJob.objects.filter(requested_by=by, status__in=ACTIVE_JOB_STATUSES)
    if active.count() >= MAX_ACTIVE_JOBS_PER_USER:
        raise CheckpointJobRefused(
            f"you have {MAX_ACTIVE_JOBS_PER_USER} checkpoint exports or evaluations waiting or "
            "running; ask again once one ends"
        )


def checkpoint_export(*, run: Run, step: int, by: Any) -> CheckpointJob:
    """Queue writing the Hugging Face folder of ``run``'s checkpoint at ``step`` to download,
    asked for by the member ``by``.

    Return the export already queued or running for it, if any; ``CheckpointJobRefused`` when
    the checkpoint is not there, already has its folder, or ``by`` has too many jobs.
    """
    with transaction.atomic():
        Run.objects.select_for_update().filter(pk=run.pk).first()  # one request at a time
        waiting = run.checkpoint_jobs.filter(
            step=step, kind=CheckpointJobKind.EXPORT, status__in=ACTIVE_JOB_STATUSES
        ).first()
        if waiting is not None:
            return waiting
        if checkpoint_hf_folder(run, step) is not None:
            raise CheckpointJobRefused(
                f"the checkpoint at step {step} has its Hugging Face folder: download it"
            )
        _check_can_queue(run, step, by)
        job = CheckpointJob.objects.create(
            run=run, step=step, kind=CheckpointJobKind.EXPORT, requested_by=by
        )
        _publish_on_commit(run.pk)
    return job


def _nested(config: dict[str, Any], *keys: str) -> Any:
    node: Any = config
    for key in keys:
        node = node.get(key) if isinstance(node, dict) else None
    return node


def eval_data_choices(*, run: Run, user: Any) -> list[tuple[str, str]]:
    """Return the data ``user`` may score an evaluation of ``run`` on: ``(choice, what it is)``.

    The run's own validation and training files (with its key map), then ``user``'s own datasets
    that passed their check (with theirs), never the run owner's: datasets stay each member's.
    Nothing else: a member never names a server path.
    """
    from webapp.datasets.selectors import dataset_list_for_user

    choices = []
    for key, label in (("val", "validation"), ("train", "training")):
        files = _nested(run.config, "data", f"{key}_files") or []
        files = [files] if isinstance(files, str) else list(files)
        if files:
            shown = ", ".join(Path(f).name if "://" not in f else f for f in files)
            choices.append((key, f"the run's {label} files ({shown})"))
    for dataset in dataset_list_for_user(user=user):
        choices.append((f"dataset:{dataset.pk}", f"dataset {dataset.name}"))
    return choices


def _eval_data(
    run: Run, choice: str, user: Any
) -> tuple[str, list[str], dict[str, str], dict[str, dict[str, Any]]]:
    """Return ``(what it is, files, key map, per-file maps)`` for a choice of
    :func:`eval_data_choices`; the per-file maps are ``data.file_key_maps`` and
    ``data.file_data_sources`` as the run (or the dataset) reads its files."""
    labels = dict(eval_data_choices(run=run, user=user))
    if choice not in labels:
        raise CheckpointJobRefused(f"data {choice!r} is not one of this run's choices; pick one")
    if choice.startswith("dataset:"):
        from webapp.datasets.models import Dataset

        dataset = Dataset.objects.get(pk=int(choice.split(":", 1)[1]), owner_id=user.pk)
        sources = {dataset.path: dataset.data_source} if dataset.data_source else {}
        per_file = {"file_key_maps": {}, "file_data_sources": sources}
        return labels[choice], [dataset.path], dict(dataset.key_map or {}), per_file
    files = _nested(run.config, "data", f"{choice}_files")
    files = [files] if isinstance(files, str) else list(files)
    key_map = _nested(run.config, "data", "data_key_map") or {}
    per_file = {
        key: dict(_nested(run.config, "data", key) or {})
        for key in ("file_key_maps", "file_data_sources")
    }
    return labels[choice], [str(f) for f in files], dict(key_map), per_file


def checkpoint_evaluate(
    *,
    run: Run,
    step: int,
    by: Any,
    data: str,
    n: int = 1,
    max_samples: int | None = None,
    temperature: float = 1.0,
) -> CheckpointJob:
    """Queue scoring ``run``'s checkpoint at ``step`` with ``engine.eval`` on the ``data`` the
    member ``by`` chose (:func:`eval_data_choices`).

    ``n`` > 1 also samples n responses a prompt at ``temperature`` (mean@n, best@n);
    ``max_samples`` scores that many prompts. ``CheckpointJobRefused`` names what is wrong.
    """
    if not 1 <= n <= N_MAX:
        raise CheckpointJobRefused(f"n={n}: sample 1 to {N_MAX} responses a prompt")
    if max_samples is not None and max_samples < 1:
        raise CheckpointJobRefused(f"max_samples={max_samples}: score at least 1 prompt")
    if n > 1 and not temperature > 0:
        raise CheckpointJobRefused(
            f"temperature={temperature}: sampling {n} responses needs a temperature above 0"
        )
    label, files, key_map, per_file = _eval_data(run, data, by)
    options = {"n": n, "max_samples": max_samples, "temperature": temperature, **per_file}
    with transaction.atomic():
        Run.objects.select_for_update().filter(pk=run.pk).first()
        _check_can_queue(run, step, by)
        job = CheckpointJob.objects.create(
            run=run,
            step=step,
            kind=CheckpointJobKind.EVALUATE,
            requested_by=by,
            dataset=label,
            data_files=files,
            key_map=key_map,
            options=options,
        )
        _publish_on_commit(run.pk)
    return job


# -- what the workers record -------------------------------------------------------------------

# The key of the advisory lock every job start takes, so two dispatchers never both take the
# last slot.
_JOB_START_LOCK = 0x706F7375


def checkpoint_jobs_queued() -> list[int]:
    """Return the ids of the queued jobs, oldest first."""
    return list(
        CheckpointJob.objects.filter(status=CheckpointJobStatus.QUEUED)
        .order_by("created_at", "pk")
        .values_list("pk", flat=True)
    )


def checkpoint_job_claim(*, job_id: int, max_running: int) -> CheckpointJob | None:
    """Move a queued job to running and return it; None when it is not queued or
    ``max_running`` jobs run already (0: no limit)."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_JOB_START_LOCK])
        running = CheckpointJob.objects.filter(status=CheckpointJobStatus.RUNNING).count()
        if max_running > 0 and running >= max_running:
            return None
        now = timezone.now()
        moved = CheckpointJob.objects.filter(pk=job_id, status=CheckpointJobStatus.QUEUED).update(
            status=CheckpointJobStatus.RUNNING, started_at=now, heartbeat_at=now
        )
        if not moved:
            return None
        job = CheckpointJob.objects.select_related("run").get(pk=job_id)
        _publish_on_commit(job.run_id)
    return job


def checkpoint_job_set_worker(*, job_id: int, worker: str) -> None:
    """Record the job's process (``pid:<n>`` on this host)."""
    CheckpointJob.objects.filter(pk=job_id).update(worker=worker, worker_host=socket.gethostname())


def checkpoint_job_heartbeat(*, job_id: int) -> bool:
    """Beat a running job's heartbeat (its process does, ``workers.checkpoint_job``); return
    False when it is no longer running."""
    running = CheckpointJob.objects.filter(pk=job_id, status=CheckpointJobStatus.RUNNING)
    return bool(running.update(heartbeat_at=timezone.now()))


def checkpoint_job_finish(
    *, job_id: int, status: str, result: dict[str, Any] | None = None, error: str = ""
) -> bool:
    """Set a running job's end state; return False when it had ended already."""
    from webapp.runs.driver_writes import error_tail

    if status not in (CheckpointJobStatus.SUCCEEDED, CheckpointJobStatus.FAILED):
        raise ValueError(f"status={status!r}: a checkpoint job ends succeeded or failed")
    with transaction.atomic():
        moved = CheckpointJob.objects.filter(pk=job_id, status__in=ACTIVE_JOB_STATUSES).update(
            status=status, result=result, error=error_tail(error), finished_at=timezone.now()
        )
        if moved:
            run_id = CheckpointJob.objects.values_list("run_id", flat=True).get(pk=job_id)
            _publish_on_commit(run_id)
    return bool(moved)


def checkpoint_jobs_mark_lost(*, timeout_s: float, now: datetime | None = None) -> list[int]:
    """Fail every running job whose process is gone; return their ids.

    Gone: a process on this host that no longer lives (found at once), or a job with no beat
    for over ``timeout_s`` seconds since its claim, on any host: its host went away, or the
    worker that claimed it died before its process started. A process on this host that lives
    is never lost; a job claimed before beats existed (no ``heartbeat_at``) is judged by its
    process alone, on its host.
    """
    from webapp.runs.driver_writes import driver_process_alive

    now = now or timezone.now()
    cutoff = now - timedelta(seconds=timeout_s)
    lost = []
    host = socket.gethostname()
    for job in CheckpointJob.objects.filter(status=CheckpointJobStatus.RUNNING).select_related(
        "run"
    ):
        if job.worker.startswith("pid:") and job.worker_host == host:
            pid = int(job.worker[4:])
            # One that lives is never lost: a database outage may have kept it from beating.
            if driver_process_alive(pid, job.pk, module=b"workers.checkpoint_job"):
                continue
            error = f"the job's process (pid {pid}) exited without recording an end state"
        elif job.heartbeat_at is not None and job.heartbeat_at < cutoff:
            where = f" ({job.worker} on {job.worker_host})" if job.worker else ""
            error = (
                f"no heartbeat from the job's process{where} for over {timeout_s:.0f} s: its "
                "host or its worker went away; ask for the job again"
            )
        else:
            continue
        log = job_log_path(job)
        tail = log.read_text(errors="replace")[-2000:] if log.is_file() else ""
        if checkpoint_job_finish(
            job_id=job.pk, status="failed", error=error + ("\n\n" + tail if tail else "")
        ):
            lost.append(job.pk)
    return lost


def failure_text(exc: BaseException) -> str:
    """Return what a failed job shows: the error's own message first, then its traceback."""
    return f"{type(exc).__name__}: {exc}\n\n" + "".join(traceback.format_exception(exc))
