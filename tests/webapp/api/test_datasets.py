"""``/api/datasets``: the upload page's checks, previews, and the owner only."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from tests.webapp.api.helpers import errors_of
from webapp.datasets.models import Dataset

pytestmark = pytest.mark.django_db

ROWS = b'{"question": "1+1", "answer": "2"}\n{"question": "2+2", "answer": "4"}\n'


def test_an_upload_is_previewed_mapped_listed_and_deleted(api, owner):
    upload = SimpleUploadedFile("math.jsonl", ROWS)
    response = api.upload(
        "/datasets", {"file": upload, "map_prompt": "question", "map_ground_truth": "answer"}
    )
    assert response.status_code == 201, response.content
    body = response.json()
    dataset = Dataset.objects.get(pk=body["id"])
    assert (body["name"], body["status"], body["row_count"]) == ("math", "ready", 2)
    assert body["key_map"] == {"prompt": "question", "ground_truth": "answer"}
    assert body["path"] == dataset.path and dataset.owner == owner
    preview = api.get(f"/datasets/{dataset.pk}/preview").json()
    assert preview["columns"] == ["question", "answer"] and len(preview["rows"]) == 2
    assert api.get(f"/datasets/{dataset.pk}").json()["preview"] == preview
    assert [d["id"] for d in api.get("/datasets").json()["items"]] == [dataset.pk]
    assert api.delete(f"/datasets/{dataset.pk}").status_code == 204
    assert not Dataset.objects.exists()


def test_a_file_that_is_no_dataset_or_no_file_is_a_field_error(api, settings):
    response = api.upload("/datasets", {"file": SimpleUploadedFile("x.jsonl", b"\x00\x01 nope")})
    assert response.status_code == 400 and "file" in errors_of(response)
    response = api.upload("/datasets", {"name": "no file"})
    assert response.status_code == 400 and "file" in errors_of(response)
    settings.POSTTRAIN_UPLOAD_MAX_BYTES = 10
    response = api.upload("/datasets", {"file": SimpleUploadedFile("big.jsonl", ROWS)})
    assert response.status_code == 400
    assert "POSTTRAIN_UPLOAD_MAX_BYTES" in errors_of(response)["file"]
    assert not Dataset.objects.exists()


def test_another_users_dataset_is_a_404(api, bob):
    upload = SimpleUploadedFile("math.jsonl", ROWS)
    dataset_id = api.upload("/datasets", {"file": upload}).json()["id"]
    for method, path in [("get", ""), ("get", "/preview"), ("delete", "")]:
        assert getattr(bob, method)(f"/datasets/{dataset_id}{path}").status_code == 404
    assert bob.get("/datasets").json()["count"] == 0
    assert Dataset.objects.filter(pk=dataset_id).exists()
