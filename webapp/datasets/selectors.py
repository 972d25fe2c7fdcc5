"""Read queries on datasets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.models import QuerySet

from webapp.datasets.models import Dataset, DatasetStatus


class DatasetUnusable(ValueError):
    """A path that names no dataset of the user's that passed its check; the message says why."""


def dataset_list_for_user(*, user: Any) -> QuerySet[Dataset]:
    """Return the datasets ``user`` can pick for an experiment (theirs, ready), newest first."""
    return Dataset.objects.filter(owner=user, status=DatasetStatus.READY)


def dataset_all_for_user(*, user: Any) -> QuerySet[Dataset]:
    """Return every dataset ``user`` uploaded, those needing a fix included, newest first."""
    return Dataset.objects.filter(owner=user)


def dataset_usable_for(*, owner: Any, path: str) -> Dataset:
    """Return ``owner``'s ready dataset whose file is ``path`` (a data.train_files value).

    Raise ``DatasetUnusable`` when ``path`` is not one of the owner's uploads, or is one whose
    last preview found errors (the message quotes the first).
    """
    uploads = Path(settings.MEDIA_ROOT).expanduser().resolve()
    resolved = Path(path).expanduser().resolve()
    dataset = None
    if resolved.is_relative_to(uploads):
        name = str(resolved.relative_to(uploads))
        dataset = Dataset.objects.filter(owner=owner, file=name).first()
    if dataset is None:
        raise DatasetUnusable("this file is not one of your datasets; upload it or pick one")
    if dataset.status != DatasetStatus.READY:
        errors = dataset.preview.get("errors") or ["its preview failed"]
        raise DatasetUnusable(
            f"dataset '{dataset.name}' did not pass its check ({errors[0]}); fix its key map on "
            "the dataset's page, upload a corrected file, or pick another dataset"
        )
    return dataset
