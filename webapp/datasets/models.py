"""An uploaded dataset file with its detected format, row count, key mapping and preview."""

from __future__ import annotations

import uuid
from pathlib import PurePath

from django.conf import settings
from django.db import models
from django.urls import reverse


class DatasetFormat(models.TextChoices):
    JSONL = "jsonl", "JSON lines"
    PARQUET = "parquet", "Parquet"
    CSV = "csv", "CSV"


class DatasetStatus(models.TextChoices):
    READY = "ready", "Ready"
    INVALID = "invalid", "Needs a fix"


def dataset_upload_to(instance: Dataset, filename: str) -> str:
    """Return a path under MEDIA_ROOT that no two uploads share: ``datasets/<owner>/<uuid>/<name>``."""
    return f"datasets/{instance.owner_id}/{uuid.uuid4().hex}/{PurePath(filename).name}"


class Dataset(models.Model):
    """A file the owner uploaded; the engine reads it through ``data.train_files`` and the key map."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="datasets"
    )
    name = models.CharField(max_length=200)
    file = models.FileField(upload_to=dataset_upload_to, max_length=500)
    format = models.CharField(max_length=10, choices=DatasetFormat.choices)
    row_count = models.PositiveIntegerField(null=True, blank=True)
    key_map = models.JSONField(
        default=dict, blank=True, help_text="data.data_key_map: file column -> engine field."
    )
    data_source = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="data_source of rows without a data_source column (a scorer's name); "
        "empty: the file name, which no scorer knows.",
    )
    preview = models.JSONField(default=dict, blank=True, help_text="The first rows, as previewed.")
    status = models.CharField(
        max_length=10,
        choices=DatasetStatus.choices,
        default=DatasetStatus.READY,
        help_text="Ready when the last preview found no error; only ready datasets feed a run.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["owner", "-created_at"], name="dataset_owner_list")]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("datasets:detail", kwargs={"dataset_id": self.pk})

    @property
    def path(self) -> str:
        """Return the file's absolute path on the server (what ``data.train_files`` holds)."""
        return self.file.path
