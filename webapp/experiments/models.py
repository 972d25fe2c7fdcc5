"""The experiment: a named engine config that its owner built in the studio and launches as runs."""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.urls import reverse


class Experiment(models.Model):
    """A validated engine config (``engine.config.config_to_dict``) with a name, tags and an owner."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="experiments"
    )
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    tags = ArrayField(models.CharField(max_length=50), default=list, blank=True)
    preset = models.CharField(max_length=100, blank=True, help_text="The preset it started from.")
    config = models.JSONField(help_text="The engine config, validated by engine.config.")
    project = models.ForeignKey(
        "projects.Project",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="experiments",
        help_text="The project whose members see it (webapp.projects.access); none: its owner's.",
    )
    archived = models.BooleanField(default=False)
    external = models.BooleanField(
        default=False,
        help_text="Holds runs the studio did not launch (webapp.external): it never launches.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]
        indexes = [
            models.Index(fields=["owner", "archived", "-updated_at"], name="experiment_owner_list"),
            GinIndex(fields=["tags"], name="experiment_tags"),
        ]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("experiments:detail", kwargs={"experiment_id": self.pk})


class LaunchKey(models.Model):
    """The token of one rendered launch or resume form, and the run its first POST created.

    A second POST of the same form (a double click, a browser retrying the request) finds the
    key and gets that run back instead of a new one (``webapp.runs.services.run_create``).
    """

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=64)
    run = models.OneToOneField("runs.Run", on_delete=models.CASCADE, related_name="launch_key")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "key"], name="launchkey_unique_owner_key")
        ]

    def __str__(self) -> str:
        return f"{self.key} -> run {self.run_id}"
