"""The user's side of a run's lifecycle: create (queue its start), resume, cancel, delete.

Starting a run queues ``workers.tasks.start_run`` by its name (``webapp.celery``); what the task
and the driver write (the start, heartbeats, the end state, metrics, samples) is
``webapp.runs.driver_writes``. Every status change goes through ``driver_writes.transition`` and its table
of allowed changes.

A launch is checked against the server's limits (``webapp.runs.quotas``) and may carry the
launch key of the form it came from: the same key again gets the run it made, not a new one.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
from functools import partial
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from engine.config import ConfigValidationError, PPOConfig, config_to_dict, set_value
from webapp.celery import send_start_run
from webapp.experiments.configs import as_config, config_check
from webapp.experiments.models import Experiment, LaunchKey
from webapp.experiments.tags import TAGS_MAX, TagsInvalid, clean_tags
from webapp.runs.driver_writes import publish_status_on_commit, transition
from webapp.runs.models import (
    ACTIVE_STATUSES,
    DRIVER_STATUSES,
    RESUMABLE_STATUSES,
    Run,
    RunStatus,
    ask_drivers_to_stop,
    run_dir,
)
from webapp.runs.quotas import LaunchRefused, run_count_check, run_size_errors
from webapp.runs.selectors import run_latest_checkpoint

logger = logging.getLogger(__name__)


# What a launch form's hidden ``launch_key`` holds: ``secrets.token_urlsafe`` output.
LAUNCH_KEY_PATTERN = re.compile(r"[A-Za-z0-9_-]{16,64}")


class RunStateError(Exception):
    """The run is not in a state that allows the action; the message says what would."""


class ExternalRunRefused(RunStateError):
    """The action would run the config of a run the studio did not launch, or steer that run."""


def refuse_external(*, experiment: Experiment, action: str) -> None:
    """Raise ``ExternalRunRefused`` when ``experiment`` holds external runs (``webapp.external``).

    Their config is what another trainer ran, kept to show and compare: it names that machine's
    paths and code and is never handed to the engine's loader or a driver here.
    """
    if experiment.external:
        raise ExternalRunRefused(
            f"{experiment.name} holds runs the studio did not launch (they report from their "
            f"own machines); the studio cannot {action} them: their config is data to show, not "
            "to run here. To run such a config in the studio, import its YAML into the "
            "experiment builder, which checks every key and path"
        )


class AlreadyLaunched(Exception):
    """The launch key was used before: ``run`` is the run that launch made."""

    def __init__(self, run: Run) -> None:
        self.run = run
        super().__init__(f"run #{run.pk} was already launched from this form")


def _move_aside(folder: Path) -> None:
    """Rename a folder left by an earlier database's run of the same id, so nothing mixes in."""
    if folder.exists():
        target = folder.with_name(f"{folder.name}.orphaned-{time.time_ns()}")
        logger.warning("run folder %s exists from an earlier database; moved to %s", folder, target)
        folder.rename(target)


def _dispatch_start(run_id: int) -> None:
    try:
        send_start_run(run_id)
    except Exception as exc:
        # Without a broker the run would wait forever; end it with the reason instead.
        logger.exception("could not queue the start of run %s", run_id)
        transition(
            run_id,
            [RunStatus.QUEUED],
            RunStatus.FAILED,
            finished_at=timezone.now(),
            error=f"the task broker did not take the start request ({type(exc).__name__}); "
            "check that Redis (REDIS_URL) answers, then launch the experiment again",
        )


def run_create(
    *,
    experiment: Experiment,
    config: PPOConfig | dict[str, Any] | None = None,
    parent: Run | None = None,
    launch_key: str = "",
    launcher: Any = None,
) -> Run:
    """Queue a new run of ``experiment`` and start it through Celery once the transaction commits.

    ``config`` defaults to the experiment's; it is validated by the engine and held to the
    server's size caps (``ConfigValidationError`` otherwise). ``LaunchRefused`` when the owner is
    at a run limit or ``launch_key`` is malformed; ``AlreadyLaunched`` when ``launch_key`` made a
    run before. In all three cases nothing is created. The run gets its own checkpoint folder; a
    run without a ``parent`` starts fresh (``resume_mode=disable``: a run never restarts in
    place, a resume is a new run), a resumed one keeps the resume settings ``run_resume`` put in.
    """
    refuse_external(experiment=experiment, action="launch")
    # The run is its launcher's (a project's editor, or the experiment's owner), and so are the
    # quotas it counts against; the config, its datasets included, stays the experiment owner's.
    launcher_id = experiment.owner_id if launcher is None else launcher.pk
    if launch_key and not LAUNCH_KEY_PATTERN.fullmatch(launch_key):
        raise LaunchRefused(
            f"launch_key must be 16 to 64 letters, digits, '-' or '_' (got {len(launch_key)} "
            "characters); reload the page for a fresh form"
        )
    cfg = as_config(experiment.config if config is None else config)
    if parent is None:
        set_value(cfg, "trainer.resume_mode", "disable")
        set_value(cfg, "trainer.resume_from_path", None)
    size_errors = run_size_errors(owner=experiment.owner, config=cfg)
    try:
        config_check(owner=experiment.owner, config=cfg)
    except ConfigValidationError as exc:
        raise ConfigValidationError([*exc.errors, *size_errors], exc.warnings) from None
    if size_errors:
        raise ConfigValidationError(size_errors)
    with transaction.atomic():
        # One launch of a user at a time: the key lookup and the counts below stay true until
        # this run is written. NO KEY UPDATE does not wait for inserts that reference the user.
        get_user_model().objects.select_for_update(no_key=True).filter(pk=launcher_id).first()
        if launch_key:
            used = LaunchKey.objects.filter(owner_id=launcher_id, key=launch_key).first()
            if used is not None:
                raise AlreadyLaunched(used.run)
        run_count_check(owner_id=launcher_id)
        Experiment.objects.select_for_update().filter(pk=experiment.pk).first()
        last = experiment.runs.aggregate(last=Max("number"))["last"] or 0
        run = Run.objects.create(
            experiment=experiment,
            owner_id=launcher_id,
            number=last + 1,
            parent=parent,
            status=RunStatus.QUEUED,
            config={},
        )
        if launch_key:
            LaunchKey.objects.create(owner_id=launcher_id, key=launch_key, run=run)
        _move_aside(run_dir(run.pk))
        checkpoints = run_dir(run.pk) / "checkpoints"
        set_value(cfg, "trainer.default_local_dir", str(checkpoints))
        run.config = config_to_dict(cfg)
        run.checkpoint_dir = str(checkpoints)
        run.save(update_fields=["config", "checkpoint_dir"])
        Experiment.objects.filter(pk=experiment.pk).update(updated_at=timezone.now())
        transaction.on_commit(partial(_dispatch_start, run.pk))
        publish_status_on_commit(run.pk)
    return run


def run_resume(*, run: Run, launch_key: str = "", launcher: Any = None) -> Run:
    """Queue a new run that continues ``run`` from its last checkpoint (step numbers continue).

    Raise ``RunStateError`` unless the run was cancelled, failed or lost and saved a checkpoint;
    ``launch_key`` and the other refusals are ``run_create``'s.
    """
    refuse_external(experiment=run.experiment, action="resume")
    if run.status not in RESUMABLE_STATUSES:
        raise RunStateError(
            f"run #{run.pk} is {run.status}; only a cancelled, failed or lost run resumes"
        )
    checkpoint = run_latest_checkpoint(run=run)
    if checkpoint is None:
        raise RunStateError(
            f"run #{run.pk} saved no checkpoint to resume from; launch it again instead "
            "(trainer.save_freq sets how often a run saves one)"
        )
    cfg = as_config(run.config)
    set_value(cfg, "trainer.resume_mode", "resume_path")
    set_value(cfg, "trainer.resume_from_path", str(checkpoint))
    return run_create(
        experiment=run.experiment,
        config=cfg,
        parent=run,
        launch_key=launch_key,
        launcher=launcher or run.owner,
    )


def run_cancel(*, run: Run) -> Run:
    """Cancel ``run``: a queued run ends now; a starting or running one stops after its step,
    and one whose driver has not stopped within its stall time the sweep stops
    (:func:`webapp.runs.driver_writes.runs_stop_unheeded_cancels`).

    An external run is asked to stop only when its client said it stops the job on request
    (``ExternalRun.cancel_honoured``); otherwise ``ExternalRunRefused`` says where it runs.
    """
    if run.experiment.external:
        external = getattr(run, "external", None)
        if external is None or not external.cancel_honoured:
            where = f" ({external.location})" if external is not None and external.location else ""
            raise ExternalRunRefused(
                f"run #{run.pk} runs outside the studio{where} and its client does not stop "
                "it on request; stop it where it runs (posttrain watch --allow-cancel and the "
                "TRL callback's allow_cancel=True let the studio ask)"
            )
    now = timezone.now()
    with transaction.atomic():
        ended = transition(
            run.pk,
            [RunStatus.QUEUED],
            RunStatus.CANCELLED,
            cancel_requested=True,
            finished_at=now,
        )
        if not ended:  # the driver sees the request after its step and ends as cancelled
            ask_drivers_to_stop(Run.objects.filter(pk=run.pk, status__in=DRIVER_STATUSES), now)
            publish_status_on_commit(run.pk)
    run.refresh_from_db()
    return run


def run_delete(*, run: Run) -> None:
    """Delete a finished run with its metrics, samples and checkpoint folder.

    Raise ``RunStateError`` while it is active: cancel it first.
    """
    if run.status in ACTIVE_STATUSES:
        if run.experiment.external:
            raise RunStateError(
                f"run #{run.pk} is {run.status} and still reports from where it runs; "
                "delete it once it has finished (or gone quiet and been marked lost)"
            )
        raise RunStateError(f"run #{run.pk} is {run.status}; cancel it before deleting it")
    folder = run_dir(run.pk)
    run.delete()
    shutil.rmtree(folder, ignore_errors=True)


NOTES_MAX_CHARS = 10_000


class RunAnnotationError(ValueError):
    """Notes or tags the run cannot take; the message says what to change."""


def run_set_notes(*, run: Run, notes: str) -> Run:
    """Replace the run's notes (any status: notes describe a run, they do not change it)."""
    notes = notes.replace("\r\n", "\n").strip()
    if len(notes) > NOTES_MAX_CHARS:
        raise RunAnnotationError(
            f"notes are {len(notes):,} characters; keep them to {NOTES_MAX_CHARS:,}"
        )
    Run.objects.filter(pk=run.pk).update(notes=notes)
    run.notes = notes
    return run


def run_add_tags(*, run: Run, tags: str) -> Run:
    """Add comma-separated ``tags`` (lower-cased, de-duplicated) to the run's tags."""
    try:
        new = clean_tags(tags)
    except TagsInvalid as exc:
        raise RunAnnotationError("; ".join(e.message for e in exc.errors)) from None
    if not new:
        raise RunAnnotationError("type a tag to add, e.g. baseline (several: baseline, lr-sweep)")
    with transaction.atomic():
        current = Run.objects.select_for_update().values_list("tags", flat=True).get(pk=run.pk)
        merged = list(dict.fromkeys([*current, *new]))
        if len(merged) > TAGS_MAX:
            raise RunAnnotationError(
                f"a run holds at most {TAGS_MAX} tags; remove some before adding more"
            )
        Run.objects.filter(pk=run.pk).update(tags=merged)
    run.tags = merged
    return run


def run_remove_tag(*, run: Run, tag: str) -> Run:
    """Remove ``tag`` from the run's tags; RunAnnotationError if the run does not have it."""
    tag = tag.strip().lower()
    with transaction.atomic():
        current = Run.objects.select_for_update().values_list("tags", flat=True).get(pk=run.pk)
        if tag not in current:
            raise RunAnnotationError(f"run #{run.pk} has no tag {tag!r}")
        kept = [t for t in current if t != tag]
        Run.objects.filter(pk=run.pk).update(tags=kept)
    run.tags = kept
    return run
