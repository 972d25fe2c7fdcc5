"""A sweep: one experiment launched as many runs, each with some config keys set to other values.

Each member is a ``Run`` of the sweep's experiment with its own config (a run stores the resolved
config it ran with, so runs of one experiment may differ): the members sit together on the
experiment page, compare and diff as runs do, and resume as runs do. ``SweepMember`` records
which values a run got and why a pruner stopped it. A sweep's status follows from its members
(``selectors``), so it is never out of date; only a cancel (and why a search stopped) is stored.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.urls import reverse


class SweepStatus(models.TextChoices):
    RUNNING = "running"  # a member is queued, starting or running
    FINISHED = "finished"
    CANCELLED = "cancelled"


class Sweep(models.Model):
    """The spec (``webapp.sweeps.spec``) a sweep expanded, its experiment and its concurrency."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sweeps"
    )
    experiment = models.ForeignKey(
        "experiments.Experiment",
        on_delete=models.CASCADE,
        related_name="sweeps",
        help_text="Its base config; every member is a run of it.",
    )
    name = models.CharField(max_length=200)
    spec = models.JSONField(help_text="The canonical spec: mode, params, count and seed.")
    keys = ArrayField(
        models.CharField(max_length=200),
        help_text="The swept keys in the spec's order (a jsonb object keeps no key order).",
    )
    concurrency = models.PositiveIntegerField(
        help_text="Members with a driver at once; the rest wait queued."
    )
    launch_key = models.CharField(max_length=64, blank=True)
    stop_reason = models.TextField(
        blank=True,
        help_text="Why a tpe sweep drew no more members (a drawn member's config was refused).",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "launch_key"],
                condition=~models.Q(launch_key=""),
                name="sweep_unique_owner_launch_key",
            )
        ]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("sweeps:detail", kwargs={"sweep_id": self.pk})


class SweepMember(models.Model):
    """One run of a sweep and the swept values it got (``{"dotted.key": value}``)."""

    sweep = models.ForeignKey(Sweep, on_delete=models.CASCADE, related_name="members")
    index = models.PositiveIntegerField(help_text="1, 2, ... in the spec's order.")
    run = models.OneToOneField("runs.Run", on_delete=models.CASCADE, related_name="sweep_member")
    values = models.JSONField()
    pruned = models.JSONField(
        null=True,
        blank=True,
        help_text="Set when the sweep's pruner stopped the member: the metric, step, value, the "
        "threshold it failed and the pruner (``webapp.sweeps.search.PruneDecision``). Its run "
        "stops after that step and ends cancelled.",
    )

    class Meta:
        ordering = ["sweep", "index"]
        constraints = [
            models.UniqueConstraint(fields=["sweep", "index"], name="sweepmember_unique_index")
        ]

    def __str__(self) -> str:
        return f"{self.sweep} member {self.index}"
