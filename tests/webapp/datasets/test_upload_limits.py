"""Uploads that are too big, mislabelled, hostile or unmapped: refused with the reason, or kept
with status "invalid" and offered to no experiment; a refused upload leaves no row and no file."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.files.uploadhandler import SkipFile
from django.test import RequestFactory
from django.urls import reverse

from engine.config import ConfigValidationError
from tests.webapp.fixtures import tiny_config
from webapp.datasets.models import Dataset, DatasetStatus
from webapp.datasets.selectors import (
    DatasetUnusable,
    dataset_all_for_user,
    dataset_list_for_user,
    dataset_usable_for,
)
from webapp.datasets.services import dataset_set_key_map
from webapp.datasets.uploads import UploadSizeCapHandler
from webapp.experiments.configs import config_check, studio_config_errors

pytestmark = pytest.mark.django_db
ROW = b'{"prompt": "1+1=", "ground_truth": "2"}\n'


def _upload(client, name: str, content: bytes, **fields):
    data = {"name": "", "file": SimpleUploadedFile(name, content), **fields}
    return client.post(reverse("datasets:upload"), data)


def _stored_files() -> list[Path]:
    """Return the files under MEDIA_ROOT (the per-owner folder may stay, empty)."""
    return [p for p in Path(settings.MEDIA_ROOT).rglob("*") if not p.is_dir()]


def _parquet(table: pa.Table, **options) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer, **options)
    return buffer.getvalue()


def test_size_cap_handler_drops_the_file_at_the_chunk_that_passes_the_limit(settings):
    settings.POSTTRAIN_UPLOAD_MAX_BYTES = 10
    handler = UploadSizeCapHandler(RequestFactory().post("/"))
    handler.new_file("file", "big.jsonl", "application/octet-stream", None)
    assert handler.receive_data_chunk(b"123456", 0) == b"123456"
    with pytest.raises(SkipFile):
        handler.receive_data_chunk(b"78901", 6)
    assert handler.refused["file"].startswith("big.jsonl is larger than 10 bytes, the limit ")


def test_upload_over_the_cap_is_refused_while_streaming_and_leaves_nothing(
    client_in, settings, tmp_path
):
    settings.POSTTRAIN_UPLOAD_MAX_BYTES = 64 * 1024
    settings.FILE_UPLOAD_MAX_MEMORY_SIZE = 1024  # the file streams into a temporary file
    settings.FILE_UPLOAD_TEMP_DIR = str(tmp_path / "spool")
    (tmp_path / "spool").mkdir()
    response = _upload(client_in, "big.jsonl", ROW * 10_000)  # 410 KB
    page = response.content.decode()
    assert response.status_code == 200
    assert (
        "big.jsonl is larger than 65,536 bytes, the limit POSTTRAIN_UPLOAD_MAX_BYTES sets; upload "
        "a smaller file (split it) or ask an administrator to raise the limit"
    ) in page
    assert "up to 65,536 bytes" in page  # the help text states the limit in force
    assert not Dataset.objects.exists() and _stored_files() == []
    assert list((tmp_path / "spool").iterdir()) == []
    ok = _upload(client_in, "small.jsonl", ROW * 100)
    assert ok.status_code == 302 and Dataset.objects.get().row_count == 100


def _zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("data.jsonl", ROW)
    return buffer.getvalue()


REFUSED = {
    "empty": ("e.jsonl", b"", "The submitted file is empty."),  # Django's FileField says so
    "zip named jsonl": ("d.jsonl", _zip(), "d.jsonl: the file is a zip archive; unpack it"),
    "UTF-16": ("u.jsonl", ROW.decode().encode("utf-16"), "u.jsonl: the file is UTF-16 text"),
    "latin-1": ("l.csv", "prompt\ncafé\n".encode("latin-1"), "l.csv: not UTF-8 text (byte 0xe9"),
    "bad JSON": ("b.jsonl", ROW + b"{nope\n", "b.jsonl, line 2: invalid JSON"),
    "JSON array": ("a.json", b'[{"prompt": "x"}]', "a.json: one JSON array; write one object"),
    "truncated parquet": (
        "t.parquet",
        _parquet(pa.table({"prompt": ["a"]}))[:-5],
        "t.parquet: starts like parquet but does not end with its footer",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED), ids=list(REFUSED))
def test_unusable_upload_is_refused_with_the_reason_and_leaves_nothing(client_in, case):
    name, content, message = REFUSED[case]
    response = _upload(client_in, name, content)
    assert response.status_code == 200
    assert message in response.content.decode().replace("&#x27;", "'")
    assert not Dataset.objects.exists() and _stored_files() == []


def test_row_and_line_limits_refuse_the_upload_naming_the_setting(client_in, settings):
    settings.POSTTRAIN_DATASET_MAX_ROWS = 3
    settings.POSTTRAIN_DATASET_MAX_LINE_BYTES = 100
    rows = _upload(client_in, "rows.jsonl", ROW * 4).content.decode()
    assert "rows.jsonl: more than 3 rows, the limit POSTTRAIN_DATASET_MAX_ROWS sets" in rows
    line = _upload(client_in, "line.jsonl", b'{"prompt": "' + b"x" * 200 + b'"}\n')
    assert (
        "line.jsonl, line 1: longer than 100 bytes, the limit POSTTRAIN_DATASET_MAX_LINE_BYTES"
        in (line.content.decode())
    )
    assert not Dataset.objects.exists() and _stored_files() == []


def test_compression_bomb_parquet_is_refused_from_its_footer(client_in, settings):
    settings.POSTTRAIN_PREVIEW_MAX_BYTES = 2**20
    text = pc.binary_repeat(pa.array(["a"]), 8 * 2**20)
    bomb = _parquet(pa.table({"prompt": text}), compression="zstd")
    assert len(bomb) < 4096
    page = _upload(client_in, "bomb.parquet", bomb).content.decode()
    assert "bomb.parquet: its first 1 rows (row group(s) [0]) decompress to 8,388,6" in page
    assert "more than the 1,048,576 that POSTTRAIN_PREVIEW_MAX_BYTES allows a preview" in page
    assert not Dataset.objects.exists() and _stored_files() == []


def test_format_comes_from_the_content_and_the_stored_name_follows_it(client_in):
    response = _upload(client_in, "notes.parquet", ROW * 2)
    dataset = Dataset.objects.get()
    assert response["Location"] == dataset.get_absolute_url()
    assert dataset.format == "jsonl" and dataset.file.name.endswith("/notes.jsonl")
    assert dataset.status == DatasetStatus.READY and dataset.name == "notes"


def test_dataset_whose_rows_do_not_map_is_kept_but_offered_to_no_experiment(client_in, owner):
    _upload(client_in, "qa.jsonl", b'{"question": "2+3=", "answer": "5"}\n')
    dataset = Dataset.objects.get()
    assert dataset.status == DatasetStatus.INVALID
    assert "no prompt column 'prompt'" in dataset.preview["errors"][0]
    assert list(dataset_all_for_user(user=owner)) == [dataset]
    assert list(dataset_list_for_user(user=owner)) == []
    with pytest.raises(DatasetUnusable, match="dataset 'qa' did not pass its check"):
        dataset_usable_for(owner=owner, path=dataset.path)
    page = client_in.get(dataset.get_absolute_url()).content.decode()
    assert "Experiments cannot use this dataset until the errors below are fixed" in page
    assert "Needs a fix" in client_in.get(reverse("datasets:list")).content.decode()
    # A config typed by hand that names it is refused too, with the dataset's own error.
    config = tiny_config(data__train_files=dataset.path)
    with pytest.raises(ConfigValidationError, match="dataset 'qa' did not pass its check"):
        config_check(owner=owner, config=config)
    dataset_set_key_map(dataset=dataset, key_map={"prompt": "question"})
    assert dataset.status == DatasetStatus.READY
    assert list(dataset_list_for_user(user=owner)) == [dataset]
    assert dataset_usable_for(owner=owner, path=dataset.path) == dataset
    assert not any(
        e.key == "data.train_files" for e in studio_config_errors(owner=owner, config=config)
    )
    with pytest.raises(DatasetUnusable, match="not one of your datasets"):
        dataset_usable_for(owner=owner, path=str(Path(settings.MEDIA_ROOT) / "other.jsonl"))
