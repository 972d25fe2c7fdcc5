"""Write operations on datasets: upload with a preview, change the key map, delete."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.files.uploadedfile import UploadedFile
from django.db import transaction

from engine.data.preview import preview_dataset
from engine.data.rows import DatasetError, check_key_map, data_format
from webapp.datasets.models import Dataset

PREVIEW_ROWS = 5


class DatasetRejected(ValueError):
    """The upload or key map cannot be used; the message says why and what to do."""


def _clean_key_map(key_map: dict[str, str] | None) -> dict[str, str]:
    try:
        return {k: v for k, v in check_key_map(key_map).items() if v}
    except DatasetError as exc:
        raise DatasetRejected(str(exc)) from None


def _refresh_preview(dataset: Dataset) -> None:
    preview = preview_dataset(dataset.path, data_key_map=dataset.key_map or None, n=PREVIEW_ROWS)
    dataset.preview = preview.to_dict()
    dataset.row_count = preview.row_count


def dataset_create(
    *, owner: Any, name: str, upload: UploadedFile, key_map: dict[str, str] | None = None
) -> Dataset:
    """Store an uploaded JSONL, parquet or CSV file as ``owner``'s dataset, with its preview.

    Raise ``DatasetRejected`` (nothing stored) for an unsupported file type or key map.
    """
    try:
        fmt = data_format(Path(upload.name))
    except DatasetError as exc:
        raise DatasetRejected(str(exc)) from None
    dataset = Dataset(
        owner=owner,
        name=name.strip() or Path(upload.name).stem,
        format=fmt,
        key_map=_clean_key_map(key_map),
    )
    with transaction.atomic():
        dataset.file.save(Path(upload.name).name, upload, save=False)
        try:
            _refresh_preview(dataset)
            dataset.save()
        except BaseException:
            dataset.file.delete(save=False)
            raise
    return dataset


def dataset_set_key_map(*, dataset: Dataset, key_map: dict[str, str]) -> Dataset:
    """Change how the file's columns map to the engine's fields, and preview again."""
    dataset.key_map = _clean_key_map(key_map)
    _refresh_preview(dataset)
    dataset.save(update_fields=["key_map", "preview", "row_count"])
    return dataset


def dataset_delete(*, dataset: Dataset) -> None:
    """Delete the dataset and its file (runs that used it keep their recorded samples)."""
    folder = Path(dataset.file.path).parent if dataset.file.name else None
    dataset.file.delete(save=False)
    dataset.delete()
    if folder is not None and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
