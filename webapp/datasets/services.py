"""Write operations on datasets: upload with a preview, change the key map, delete.

An upload is untrusted: its format is sniffed from its bytes (the stored name gets the matching
extension, which is what training reads it by) and it is previewed in a memory-limited child
process under the ``POSTTRAIN_*`` limits. A file that cannot be used at all is refused and
nothing is kept; a file whose rows do not map yet is kept with status "invalid" and its errors,
for the owner to fix with the key map, and cannot be picked for an experiment until then.
"""

from __future__ import annotations

from pathlib import Path, PurePath
from typing import Any

from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.db import transaction

from engine.data.preview import DatasetPreview, PreviewLimits, preview_untrusted
from engine.data.rows import (
    FORMAT_SUFFIX,
    PARQUET_MAGIC,
    SNIFF_BYTES,
    DatasetError,
    check_key_map,
    sniff_format,
)
from webapp.datasets.models import Dataset, DatasetStatus
from webapp.datasets.uploads import size_text

PREVIEW_ROWS = 5


class DatasetRejected(ValueError):
    """The upload or key map cannot be used; the message says why and what to do."""


def preview_limits() -> PreviewLimits:
    """Return how much of a dataset file a preview may read, from the settings."""
    return PreviewLimits(
        max_rows=settings.POSTTRAIN_DATASET_MAX_ROWS,
        max_line_bytes=settings.POSTTRAIN_DATASET_MAX_LINE_BYTES,
        max_decoded_bytes=settings.POSTTRAIN_PREVIEW_MAX_BYTES,
    )


def _clean_key_map(key_map: dict[str, str] | None) -> dict[str, str]:
    try:
        return {k: v for k, v in check_key_map(key_map).items() if v}
    except DatasetError as exc:
        raise DatasetRejected(str(exc)) from None


def _sniff_upload(upload: UploadedFile) -> str:
    """Return the upload's format from its first and last bytes."""
    size = upload.size or 0
    limit = settings.POSTTRAIN_UPLOAD_MAX_BYTES
    if size > limit:  # the upload handler drops these while streaming; this guards other callers
        raise DatasetRejected(
            f"{upload.name} is larger than {size_text(limit)}, the limit "
            "POSTTRAIN_UPLOAD_MAX_BYTES sets; upload a smaller file (split it) or ask an "
            "administrator to raise the limit"
        )
    upload.seek(0)
    head = upload.read(SNIFF_BYTES)
    upload.seek(max(size - len(PARQUET_MAGIC), 0))
    tail = upload.read()
    upload.seek(0)
    try:
        return sniff_format(head, tail, size=size, name=str(upload.name))
    except DatasetError as exc:
        raise DatasetRejected(str(exc)) from None


def _refresh_preview(dataset: Dataset) -> DatasetPreview:
    preview = preview_untrusted(
        dataset.path,
        data_key_map=dataset.key_map or None,
        n=PREVIEW_ROWS,
        limits=preview_limits(),
        data_source=dataset.data_source,
    )
    dataset.preview = preview.to_dict()
    dataset.row_count = preview.row_count
    dataset.status = DatasetStatus.INVALID if preview.errors else DatasetStatus.READY
    return preview


def _delete_file(dataset: Dataset) -> None:
    """Delete the dataset's file and the folder ``dataset_upload_to`` made for it."""
    if not dataset.file.name:
        return
    folder = Path(dataset.file.path).parent
    dataset.file.delete(save=False)
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


def dataset_create(
    *,
    owner: Any,
    name: str,
    upload: UploadedFile,
    key_map: dict[str, str] | None = None,
    data_source: str = "",
) -> Dataset:
    """Store an uploaded parquet, JSONL or CSV file as ``owner``'s dataset, with its preview.

    Raise ``DatasetRejected`` (nothing stored) for a file that is not one of those formats, is
    over a ``POSTTRAIN_*`` limit or cannot be read, and for an unknown key-map target. A file
    whose rows do not map is stored with status "invalid" and the errors in its preview.
    """
    fmt = _sniff_upload(upload)
    stem = PurePath(str(upload.name)).stem or "dataset"
    dataset = Dataset(
        owner=owner,
        name=name.strip() or stem,
        format=fmt,
        key_map=_clean_key_map(key_map),
        data_source=data_source.strip(),
    )
    with transaction.atomic():
        dataset.file.save(stem + FORMAT_SUFFIX[fmt], upload, save=False)
        try:
            preview = _refresh_preview(dataset)
            if preview.file_error:
                raise DatasetRejected(preview.file_error.replace(dataset.path, str(upload.name)))
            dataset.save()
        except BaseException:
            _delete_file(dataset)
            raise
    return dataset


def dataset_set_key_map(
    *, dataset: Dataset, key_map: dict[str, str], data_source: str | None = None
) -> Dataset:
    """Change how the file's columns map to the engine's fields (and, when given, the
    data_source of rows without one), and preview again."""
    dataset.key_map = _clean_key_map(key_map)
    if data_source is not None:
        dataset.data_source = data_source.strip()
    _refresh_preview(dataset)
    dataset.save(update_fields=["key_map", "data_source", "preview", "row_count", "status"])
    return dataset


def dataset_delete(*, dataset: Dataset) -> None:
    """Delete the dataset and its file (runs that used it keep their recorded samples)."""
    _delete_file(dataset)
    dataset.delete()
