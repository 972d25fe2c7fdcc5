"""Stream filtered samples as JSONL or CSV without holding them in memory.

Rows come from a server-side cursor (``QuerySet.iterator(chunk_size=...)``), are encoded a
chunk at a time, and leave as a ``StreamingHttpResponse``. Under ASGI Django reads a streaming
body with ``async for`` and would first copy a plain iterator into a list, so an ASGI request
gets an async iterator that pulls each chunk from the cursor in the request's own thread.

JSONL carries every column and the per-token arrays (``tokens=0`` leaves them out); CSV carries
the scalar columns, with ``reward_parts`` as a JSON string. Non-finite floats are written as
``null`` (JSONL) or an empty cell (CSV), since JSON has no NaN. CSV text cells that a
spreadsheet would run as a formula start with an apostrophe (``webapp.spreadsheet``).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, StreamingHttpResponse

from webapp.samples.selectors import EXPORT_FIELDS, TOKEN_FIELDS, SampleFilter, sample_export_rows
from webapp.spreadsheet import spreadsheet_text

EXPORT_CHUNK_ROWS = 1000
FORMATS = {
    "jsonl": "application/x-ndjson; charset=utf-8",
    "csv": "text/csv; charset=utf-8",
}


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def jsonl_chunks(rows: Iterable[Sequence[Any]], fields: Sequence[str]) -> Iterator[bytes]:
    """Yield ``rows`` as JSON lines, ``EXPORT_CHUNK_ROWS`` lines per chunk."""
    lines: list[str] = []
    for row in rows:
        record = {name: _json_safe(value) for name, value in zip(fields, row, strict=True)}
        lines.append(json.dumps(record, ensure_ascii=False, allow_nan=False))
        if len(lines) >= EXPORT_CHUNK_ROWS:
            yield ("\n".join(lines) + "\n").encode()
            lines = []
    if lines:
        yield ("\n".join(lines) + "\n").encode()


def _csv_cell(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return ""
    if isinstance(value, dict | list):
        return json.dumps(_json_safe(value), ensure_ascii=False, allow_nan=False)
    if isinstance(value, str):
        return spreadsheet_text(value)
    return "" if value is None else value


def csv_chunks(rows: Iterable[Sequence[Any]], fields: Sequence[str]) -> Iterator[bytes]:
    """Yield a header and ``rows`` as CSV, ``EXPORT_CHUNK_ROWS`` rows per chunk."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(fields)
    for count, row in enumerate(rows, start=1):
        writer.writerow([_csv_cell(v) for v in row])
        if count % EXPORT_CHUNK_ROWS == 0:
            yield buffer.getvalue().encode()
            buffer.seek(0)
            buffer.truncate()
    if buffer.tell():
        yield buffer.getvalue().encode()


async def _pull(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """Yield ``chunks`` to an async reader, advancing them in the request's sync thread."""
    done = object()
    try:
        while True:
            chunk = await sync_to_async(next, thread_sensitive=True)(chunks, done)
            if chunk is done:
                return
            yield chunk
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            await sync_to_async(close, thread_sensitive=True)()


def export_response(
    request: HttpRequest, queryset: Any, *, fmt: str, with_tokens: bool, filename: str
) -> StreamingHttpResponse:
    """Return a streamed download of ``queryset``'s rows (from ``sample_export_rows``)."""
    if fmt not in FORMATS:
        raise ValueError(f"export format {fmt!r} is unknown; use one of {sorted(FORMATS)}")
    fields = EXPORT_FIELDS + (TOKEN_FIELDS if with_tokens else ())
    rows = queryset.iterator(chunk_size=EXPORT_CHUNK_ROWS)
    chunks = jsonl_chunks(rows, fields) if fmt == "jsonl" else csv_chunks(rows, fields)
    content: Any = _pull(chunks) if isinstance(request, ASGIRequest) else chunks
    response = StreamingHttpResponse(content, content_type=FORMATS[fmt])
    response["Content-Disposition"] = f'attachment; filename="{filename}.{fmt}"'
    response["Cache-Control"] = "no-store"
    return response


def sample_export_response(
    request: HttpRequest, *, run: Any, filters: SampleFilter, fmt: str, tokens: bool = True
) -> StreamingHttpResponse:
    """Return the download of ``run``'s samples that pass ``filters`` (one step, or all).

    JSONL carries the per-token arrays unless ``tokens`` is False; CSV never does.
    """
    with_tokens = fmt == "jsonl" and tokens
    rows = sample_export_rows(
        user=request.user, run_id=run.pk, filters=filters, with_tokens=with_tokens
    )
    step = "all" if filters.step is None else filters.step
    name = f"run-{run.pk}-{filters.split}-step-{step}-samples"
    return export_response(request, rows, fmt=fmt, with_tokens=with_tokens, filename=name)
