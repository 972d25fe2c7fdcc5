"""What the studio knows of a run it did not launch, beside the ``Run`` row every page reads.

An external run is an ordinary ``runs.Run`` (its metrics, samples and status in the same tables,
so every page works for it) of an experiment marked ``external``, plus this row: which trainer
reports it, where it lives (as its client says: text to show, never a path the server opens),
whether its client stops the job when the owner cancels it, and how many log lines arrived.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class ExternalSource(models.TextChoices):
    VERL = "verl", "verl"
    TRL = "trl", "TRL"
    ENGINE = "engine", "the engine's CLI"
    OTHER = "other", "another trainer"


class ExternalRun(models.Model):
    """The client's side of an external run: its source, its place, its cancel policy."""

    run = models.OneToOneField(
        "runs.Run", on_delete=models.CASCADE, primary_key=True, related_name="external"
    )
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(
        max_length=64, help_text="The client's key: creating with it again returns this run."
    )
    source = models.CharField(max_length=16, choices=ExternalSource.choices)
    location = models.CharField(
        max_length=500, blank=True, help_text="Where the run lives, as its client describes it."
    )
    client = models.CharField(max_length=100, blank=True, help_text="The reporting program.")
    cancel_honoured = models.BooleanField(
        default=False, help_text="The client stops the job when the owner cancels the run."
    )
    log_lines = models.PositiveBigIntegerField(default=0, help_text="Log lines received so far.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "key"], name="externalrun_unique_owner_key")
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} ({self.source})"
