"""Reports: a saved view of chosen runs and seed groups, their charts, a sample table and notes.

A report is read at ``/reports/<uuid>/`` by its owner and by the members of its project; what it
shows of the runs is decided for each reader (``webapp.reports.selectors``), so a report never
shows a run its reader may not read.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.urls import reverse


class Report(models.Model):
    """The runs and groups (by token, as the compare page names them) a report draws."""

    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="reports"
    )
    # A deleted project leaves the report its owner's alone.
    project = models.ForeignKey(
        "projects.Project",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="reports",
    )
    title = models.CharField(max_length=200)
    notes = models.TextField(blank=True, help_text="Markdown; raw HTML is shown as text.")
    run_ids = models.JSONField(default=list)
    group_tokens = models.JSONField(default=list)
    metrics = models.JSONField(default=list)
    sample_count = models.PositiveIntegerField(
        default=3, help_text="The table shows this many best and worst samples of each run."
    )
    sample_step = models.PositiveIntegerField(
        null=True, blank=True, help_text="The step of the sample table; empty: each run's latest."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]

    def __str__(self) -> str:
        return self.title

    @property
    def metrics_text(self) -> str:
        """Return the charted metrics one a line, as the edit form shows them."""
        return "\n".join(self.metrics)

    def get_absolute_url(self) -> str:
        return reverse("reports:detail", kwargs={"report_id": self.uuid})
