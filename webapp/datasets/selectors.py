"""Read queries on datasets."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from webapp.datasets.models import Dataset


def dataset_list_for_user(*, user: Any) -> QuerySet[Dataset]:
    """Return the datasets ``user`` uploaded, newest first."""
    return Dataset.objects.filter(owner=user)
