"""Runs and what they record: one ``MetricPoint`` per (run, step) and append-only ``Sample`` rows.

A run's status lives in PostgreSQL, which is the source of truth: the Celery task moves it from
``queued`` to ``starting``, the driver to ``running`` and to its end state, and the lost-run sweep
to ``lost`` when its driver is gone (a local process that exited, or a stale heartbeat).
Per-token arrays are ``real[]`` (4 bytes a value), which PostgreSQL compresses out of line for
long responses; samples arrive through COPY.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models import F, Value
from django.db.models.functions import Coalesce
from django.urls import reverse

from engine.trainer.reporting import RunOutcome


class RealField(models.FloatField):
    """A single-precision float column (``real``), for the per-token arrays."""

    def db_type(self, connection) -> str:
        return "real"


def ask_drivers_to_stop(runs: models.QuerySet[Run], now: datetime) -> int:
    """Ask the drivers of ``runs`` to stop after their step (``cancel_requested``), keeping the
    time a cancel first asked (``cancel_requested_at``: the sweep stops a driver that has not
    heeded it for the run's stall time); return how many runs were asked."""
    first_asked = Coalesce(
        F("cancel_requested_at"), Value(now, output_field=models.DateTimeField())
    )
    return runs.update(cancel_requested=True, cancel_requested_at=first_asked)


def run_dir(run_id: int) -> Path:
    """Return the folder of a run's files: ``<POSTTRAIN_DATA_DIR>/runs/<id>``."""
    return Path(settings.POSTTRAIN_DATA_DIR).expanduser() / "runs" / str(run_id)


def run_group_name(run_id: int) -> str:
    """Return the Channels group that receives the live events of a run (``run.<id>``)."""
    return f"run.{run_id}"


class RunStatus(models.TextChoices):
    """A run's state in the studio: the engine's end states (``RunOutcome``) and those before."""

    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = RunOutcome.SUCCEEDED.value
    FAILED = RunOutcome.FAILED.value
    CANCELLED = RunOutcome.CANCELLED.value
    LOST = "lost"


ACTIVE_STATUSES = (RunStatus.QUEUED, RunStatus.STARTING, RunStatus.RUNNING)
# A driver beats the heartbeat only while it lives: these are the states the sweep may mark lost.
DRIVER_STATUSES = (RunStatus.STARTING, RunStatus.RUNNING)
RESUMABLE_STATUSES = (RunStatus.CANCELLED, RunStatus.FAILED, RunStatus.LOST)
# The driver of a run the studio did not launch: ``external:verl``, ``external:trl``...
EXTERNAL_DRIVER_PREFIX = "external:"
# The driver of a run submitted as a Ray Job: ``ray:<submission id>``.
RAY_DRIVER_PREFIX = "ray:"


# A sample's fields in one order: what the driver COPYs (``driver_writes.SAMPLE_COLUMNS``, after the
# run), what an export writes (``samples.selectors.EXPORT_FIELDS``: the scalars, then the token
# arrays on request) and what the engine's ``SampleRecord`` carries. A test holds all three to
# the ``Sample`` model.
SAMPLE_SCALAR_FIELDS = (
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
    "turns",
)
SAMPLE_TOKEN_FIELDS = ("tokens", "token_logprobs", "token_ref_logprobs", "token_advantages")
SAMPLE_FIELDS = SAMPLE_SCALAR_FIELDS + SAMPLE_TOKEN_FIELDS


class Run(models.Model):
    """One launch of an experiment with the resolved config it ran with."""

    experiment = models.ForeignKey(
        "experiments.Experiment", on_delete=models.CASCADE, related_name="runs"
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="runs"
    )
    number = models.PositiveIntegerField(
        help_text="1, 2, ... within the experiment. Pages name a run by its id: run #<id>."
    )
    parent = models.ForeignKey(
        "self",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="children",
        help_text="The run this one resumes.",
    )
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED)
    config = models.JSONField(help_text="The resolved engine config this run was launched with.")
    cancel_requested = models.BooleanField(default=False)
    cancel_requested_at = models.DateTimeField(
        null=True, blank=True, help_text="When a cancel first asked the driver to stop."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True, help_text="The full traceback of a failed run.")
    checkpoint_dir = models.CharField(max_length=500, blank=True)
    latest_checkpoint = models.CharField(max_length=500, blank=True)
    start_step = models.PositiveIntegerField(default=0)
    latest_step = models.PositiveIntegerField(default=0)
    total_steps = models.PositiveIntegerField(null=True, blank=True)
    # An external run's is ``external:<source>`` (``EXTERNAL_DRIVER_PREFIX``).
    driver = models.CharField(max_length=200, blank=True, help_text="pid:<n> or ray:<job id>.")
    driver_host = models.CharField(
        max_length=255, blank=True, help_text="The host whose process a pid:<n> driver is."
    )
    stalled_since = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Set while a running run's driver lives but has recorded no step since then.",
    )
    failure_reason = models.TextField(
        blank=True,
        help_text="Set when the studio stops the run for a reason of its own (its rewards keep "
        "failing): the driver stops after its step and the run ends failed with it.",
    )
    notes = models.TextField(blank=True, help_text="The owner's notes on the run.")
    tags = ArrayField(models.CharField(max_length=50), default=list, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["experiment", "number"], name="run_unique_number")
        ]
        indexes = [
            models.Index(fields=["experiment", "-created_at"], name="run_experiment_list"),
            models.Index(fields=["owner", "status"], name="run_owner_status"),
            models.Index(
                fields=["heartbeat_at"],
                name="run_driver_heartbeat",
                condition=models.Q(status__in=["starting", "running"]),
            ),
            GinIndex(fields=["tags"], name="run_tags"),
        ]

    def __str__(self) -> str:
        return f"{self.experiment.name} · run #{self.pk}"

    def get_absolute_url(self) -> str:
        return reverse("runs:detail", kwargs={"run_id": self.pk})

    @property
    def group_name(self) -> str:
        return run_group_name(self.pk)

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_STATUSES

    @property
    def is_external(self) -> bool:
        """Whether a trainer the studio did not launch reports the run (``webapp.external``).

        Read from the row itself (no query): such a run's driver is ``external:<source>``, set
        once with its experiment's ``external`` flag, which the services check.
        """
        return self.driver.startswith(EXTERNAL_DRIVER_PREFIX)

    @property
    def can_resume(self) -> bool:
        return self.status in RESUMABLE_STATUSES and not self.is_external

    @property
    def can_cancel(self) -> bool:
        """Whether cancel is offered: an active studio run, or an external one whose client
        stops the job when asked (``ExternalRun.cancel_honoured``)."""
        if not self.is_active:
            return False
        if not self.is_external:
            return True
        external = getattr(self, "external", None)
        return external is not None and external.cancel_honoured


class MetricPoint(models.Model):
    """All metrics of one training step, keyed by verl's names (``critic/score/mean``...)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metric_points")
    step = models.PositiveIntegerField()
    wall_time = models.DateTimeField()
    metrics = models.JSONField()

    class Meta:
        ordering = ["step"]
        constraints = [
            models.UniqueConstraint(fields=["run", "step"], name="metricpoint_unique_run_step")
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step}"


class SampleSplit(models.TextChoices):
    TRAIN = "train"
    VAL = "val"


class Sample(models.Model):
    """One rollout: keyed by (run, step, split, prompt_index, sample_index); written by COPY."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="samples")
    step = models.PositiveIntegerField()
    split = models.CharField(max_length=8, choices=SampleSplit.choices)
    prompt_index = models.PositiveIntegerField()
    sample_index = models.PositiveIntegerField(help_text="Position within the prompt's group.")
    group_id = models.CharField(max_length=100, blank=True)
    data_source = models.CharField(max_length=100, blank=True)
    prompt_text = models.TextField()
    response_text = models.TextField()
    ground_truth = models.TextField(null=True, blank=True)
    reward = models.FloatField()
    reward_parts = models.JSONField(default=dict)
    reward_error = models.TextField(null=True, blank=True)
    advantage = models.FloatField(null=True, blank=True)
    response_length = models.PositiveIntegerField(default=0)
    truncated = models.BooleanField(default=False)
    turns = models.JSONField(
        null=True,
        blank=True,
        help_text="Multi-turn rollouts: each turn after the prompt, with tool calls and answers.",
    )
    tokens = ArrayField(models.TextField(), default=list)
    token_logprobs = ArrayField(RealField(), default=list)
    token_ref_logprobs = ArrayField(RealField(), null=True, blank=True)
    token_advantages = ArrayField(RealField(), null=True, blank=True)

    class Meta:
        ordering = ["step", "split", "prompt_index", "sample_index"]
        indexes = [
            models.Index(
                fields=["run", "split", "step", "prompt_index", "sample_index"],
                name="sample_by_step",
            ),
            models.Index(fields=["run", "prompt_index", "step"], name="sample_by_prompt"),
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step} {self.split} p{self.prompt_index}/{self.sample_index}"


class CheckpointJobKind(models.TextChoices):
    EXPORT = "export"  # a Hugging Face folder of the checkpoint, to download
    EVALUATE = "evaluate"  # engine.eval's figures on a dataset


class CheckpointJobStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class CheckpointJob(models.Model):
    """Work on one of a run's checkpoints, done by a worker process, never the web process.

    ``export`` writes the checkpoint's Hugging Face folder when it saved none (the model
    merger); ``evaluate`` scores it with ``engine.eval`` on ``data_files`` and keeps the figures
    in ``result``. See ``webapp.runs.checkpoints`` and ``workers.checkpoint_job``.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoint_jobs")
    step = models.PositiveIntegerField(help_text="The checkpoint: global_step_<step>.")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="Who asked for it: the job counts against their limit, not the run owner's.",
    )
    kind = models.CharField(max_length=16, choices=CheckpointJobKind.choices)
    status = models.CharField(
        max_length=16, choices=CheckpointJobStatus.choices, default=CheckpointJobStatus.QUEUED
    )
    dataset = models.CharField(max_length=300, blank=True, help_text="What the data is, shown.")
    data_files = models.JSONField(default=list, blank=True)
    key_map = models.JSONField(default=dict, blank=True, help_text="data.data_key_map of the data.")
    options = models.JSONField(
        default=dict, blank=True, help_text="engine.eval's options: n, max_samples, temperature."
    )
    result = models.JSONField(null=True, blank=True, help_text="engine.eval's figures.")
    error = models.TextField(blank=True)
    worker = models.CharField(max_length=200, blank=True, help_text="pid:<n> of its process.")
    worker_host = models.CharField(max_length=255, blank=True)
    heartbeat_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="The claim, then each beat of its process: a job silent for the heartbeat "
        "timeout has lost its process, on any host. Empty for jobs claimed before beats existed.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["run", "step"], name="checkpointjob_run_step"),
            models.Index(
                fields=["status", "created_at"],
                name="checkpointjob_waiting",
                condition=models.Q(status__in=["queued", "running"]),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} of run {self.run_id} step {self.step}"

    @property
    def is_active(self) -> bool:
        return self.status in (CheckpointJobStatus.QUEUED, CheckpointJobStatus.RUNNING)

    @property
    def error_summary(self) -> str:
        """Return the first line of a failed job's error: what went wrong, in a line."""
        return self.error.partition("\n")[0]


class RunTableChoice(models.Model):
    """The runs table's columns and sort a member chose last (``webapp.runs.table``)."""

    owner = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="run_table_choice"
    )
    params = models.JSONField(
        help_text='The query parameters of its columns: {"metric": [...], "col": [...], "sort": [...]}.'
    )
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"runs table of {self.owner_id}"
