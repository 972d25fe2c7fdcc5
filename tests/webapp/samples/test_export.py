"""Exports: JSONL and CSV of the filtered samples, streamed from a server-side cursor."""

from __future__ import annotations

import csv
import io
import json

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections
from django.test import AsyncClient
from django.urls import reverse

from tests.webapp.samples.conftest import finished_run, records
from webapp.runs.driver_writes import samples_write
from webapp.samples import export

pytestmark = pytest.mark.django_db


def export_url(run, fmt: str, **query) -> str:
    base = reverse(f"samples:export-{fmt}", kwargs={"run_id": run.pk})
    return base + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


def body(response) -> str:
    assert response.streaming
    return b"".join(response.streaming_content).decode()


def test_jsonl_has_every_column_and_the_token_arrays(client_in, sampled_run):
    response = client_in.get(export_url(sampled_run, "jsonl"))
    assert response["Content-Type"] == "application/x-ndjson; charset=utf-8"
    assert response["Content-Disposition"] == (
        f'attachment; filename="run-{sampled_run.pk}-train-step-all-samples.jsonl"'
    )
    rows = [json.loads(line) for line in body(response).splitlines()]
    assert len(rows) == 36
    assert [(r["step"], r["prompt_index"], r["sample_index"]) for r in rows[:2]] == [
        (1, 0, 0),
        (1, 0, 1),
    ]
    first = rows[0]
    assert first["prompt_text"] == "What is 0 + 1?" and first["reward"] == 1.0
    assert first["reward_parts"] == {"correct": 1.0, "format": 0.5}
    assert first["tokens"] == ["Ġ4", "2", "</s>"]
    assert first["token_ref_logprobs"] == [-0.5, -1.0, -0.125]
    nan_row = next(
        r for r in rows if (r["step"], r["prompt_index"], r["sample_index"]) == (2, 2, 3)
    )
    assert nan_row["reward"] is None  # JSON has no NaN
    lean = body(client_in.get(export_url(sampled_run, "jsonl", step=1, tokens=0)))
    assert "tokens" not in json.loads(lean.splitlines()[0])


def test_csv_has_the_scalar_columns_of_the_filtered_rows(client_in, sampled_run):
    response = client_in.get(export_url(sampled_run, "csv", step=2, sort="-reward", reward_min=2.9))
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    table = list(csv.reader(io.StringIO(body(response))))
    assert table[0] == list(export.EXPORT_FIELDS)
    assert [(row[3], row[4], row[10]) for row in table[1:]] == [
        ("1", "3", "3.0"),
        ("2", "2", "3.0"),
    ]
    assert json.loads(table[1][11]) == {"correct": 3.0, "format": 0.5}
    every = list(csv.DictReader(io.StringIO(body(client_in.get(export_url(sampled_run, "csv"))))))
    assert len(every) == 36
    assert {r["reward"] for r in every if r["step"] == "2" and r["prompt_index"] == "2"} == {
        "2.5",
        "2.75",
        "3.0",
        "",
    }


def test_a_bad_filter_is_refused_before_streaming(client_in, sampled_run):
    response = client_in.get(export_url(sampled_run, "csv", split="test"))
    assert response.status_code == 400
    assert "Select a valid choice. test is not one of the available choices." in (
        response.content.decode()
    )


def test_rows_come_from_a_server_side_cursor_a_chunk_at_a_time(client_in, sampled_run, monkeypatch):
    monkeypatch.setattr(export, "EXPORT_CHUNK_ROWS", 5)
    response = client_in.get(export_url(sampled_run, "jsonl"))
    chunks = iter(response.streaming_content)
    first = next(chunks).decode().splitlines()
    assert len(first) == 5
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_cursors")
        open_cursors = [row[0] for row in cursor.fetchall()]
    assert len(open_cursors) == 1 and "DECLARE" in open_cursors[0]
    rest = [line for chunk in chunks for line in chunk.decode().splitlines()]
    assert len(first) + len(rest) == 36


@pytest.mark.django_db(transaction=True)
async def test_under_asgi_the_body_is_an_async_stream(sampled_run, owner):
    client = AsyncClient()
    try:
        await client.aforce_login(owner)
        response = await client.get(export_url(sampled_run, "csv", step=3))
        assert response.streaming and response.is_async
        text = b"".join([chunk async for chunk in response.streaming_content]).decode()
        assert len(text.splitlines()) == 1 + 12
    finally:
        # The view ran in asgiref's thread; its connection would outlive the test database.
        await sync_to_async(connections.close_all)()


def test_csv_text_a_spreadsheet_would_run_starts_with_an_apostrophe(client_in, owner):
    run = finished_run(owner, name="formulas")
    texts = ['=HYPERLINK("http://x.invalid")', "+1+cmd", "-2", "@SUM(A1)"]
    samples_write(run_id=run.pk, samples=records(1, 0, [1.0] * 4, responses=texts))
    rows = list(csv.DictReader(io.StringIO(body(client_in.get(export_url(run, "csv"))))))
    assert [r["response_text"] for r in rows] == ["'" + text for text in texts]
    assert {r["reward"] for r in rows} == {"1.0"}  # numbers are written as numbers
    lines = body(client_in.get(export_url(run, "jsonl", tokens=0))).splitlines()
    assert [json.loads(line)["response_text"] for line in lines] == texts  # JSONL: verbatim
