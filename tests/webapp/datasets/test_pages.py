"""The dataset pages a user clicks through, each checked for what it shows or changes."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from webapp.datasets.models import Dataset

pytestmark = pytest.mark.django_db


def test_dataset_upload_previews_rows_and_remaps_columns(client_in, owner):
    text = b'{"question": "2+3=", "answer": "5"}\n{"question": "7+1=", "answer": "8"}\n'
    response = client_in.post(
        reverse("datasets:upload"),
        {"name": "", "file": SimpleUploadedFile("sums.jsonl", text), "map_prompt": "question"},
    )
    dataset = Dataset.objects.get()
    assert response["Location"] == dataset.get_absolute_url()
    assert (dataset.name, dataset.format, dataset.row_count) == ("sums", "jsonl", 2)
    assert dataset.key_map == {"prompt": "question"}
    assert dataset.preview["columns"] == ["question", "answer"]
    assert dataset.preview["mapped"][0] == {
        "prompt": "2+3=",
        "ground_truth": None,
        "data_source": "sums",
    }
    client_in.post(
        dataset.get_absolute_url(), {"map_prompt": "question", "map_ground_truth": "answer"}
    )
    dataset.refresh_from_db()
    assert dataset.preview["errors"] == []
    assert dataset.preview["mapped"][0]["prompt"] == "2+3="
    assert dataset.preview["mapped"][0]["ground_truth"] == "5"
    page = client_in.get(dataset.get_absolute_url()).content.decode()
    assert "7+1=" in page
    download = client_in.get(reverse("datasets:download", kwargs={"dataset_id": dataset.pk}))
    assert b"".join(download.streaming_content) == text
    bad = client_in.post(reverse("datasets:upload"), {"file": SimpleUploadedFile("x.txt", b"hi")})
    assert "x.txt: neither parquet, JSON Lines nor CSV" in bad.content.decode()
    path = Path(dataset.path)
    client_in.post(reverse("datasets:delete", kwargs={"dataset_id": dataset.pk}))
    assert not Dataset.objects.exists() and not path.exists()


def test_upload_picks_the_data_source_that_selects_a_reward(client_in, owner):
    """A file with no data_source column was named after the file, which no reward scores."""
    text = b'{"question": "2+3=", "answer": "5"}\n'
    form = client_in.get(reverse("datasets:upload")).content.decode()
    assert "gsm8k — ground_truth: the final number" in form
    client_in.post(
        reverse("datasets:upload"),
        {"file": SimpleUploadedFile("sums.jsonl", text), "map_prompt": "question"},
    )
    unscored = Dataset.objects.get()
    page = client_in.get(unscored.get_absolute_url()).content.decode()
    assert "<code>sums</code>: no reward scores this data_source" in page
    client_in.post(
        unscored.get_absolute_url(),
        {"data_source": "tiny_arithmetic", "map_prompt": "question", "map_ground_truth": "answer"},
    )
    unscored.refresh_from_db()
    assert unscored.data_source == "tiny_arithmetic"
    assert unscored.preview["mapped"][0]["data_source"] == "tiny_arithmetic"
    assert unscored.preview["data_sources"] == ["tiny_arithmetic"]
    page = client_in.get(unscored.get_absolute_url()).content.decode()
    assert "<code>tiny_arithmetic</code>: scored by the default reward" in page
    assert "no reward scores" not in page
