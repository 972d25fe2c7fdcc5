"""The ASGI body cap: a request body past POSTTRAIN_UPLOAD_MAX_BYTES is refused before Django spools it.

The requests go through ``webapp.asgi.application`` itself with a hand-made ``receive`` that
counts what the server pulls, so the tests see both the answer and how much was read.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.webapp.asgi import asgi_request
from webapp.body_limit import FORM_ALLOWANCE_BYTES
from webapp.datasets.uploads import size_text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]

LIMIT = 64 * 1024
CHUNK = 16 * 1024


@pytest.fixture(autouse=True)
def small_limit(settings):
    settings.POSTTRAIN_UPLOAD_MAX_BYTES = LIMIT


class Upload:
    """A client that sends ``chunks`` body chunks of CHUNK bytes (forever when None)."""

    def __init__(self, chunks: int | None) -> None:
        self.chunks = chunks
        self.pulled = 0

    async def receive(self) -> dict:
        if self.chunks is not None and self.pulled >= self.chunks:
            await asyncio.Event().wait()  # the whole body is sent: wait, as a connected client does
        self.pulled += 1
        more = self.chunks is None or self.pulled < self.chunks
        return {"type": "http.request", "body": b"x" * CHUNK, "more_body": more}


async def post(upload: Upload, headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes]:
    """POST ``upload`` to the dataset upload page through the ASGI app; return status and body."""
    return await asgi_request("POST", "/datasets/upload/", upload.receive, headers)


def assert_refused(status: int, body: bytes) -> None:
    assert status == 413
    text = body.decode()
    limit = size_text(LIMIT + FORM_ALLOWANCE_BYTES)
    assert text.startswith(f"The request body is larger than {limit}: the limit ")
    assert "POSTTRAIN_UPLOAD_MAX_BYTES" in text and "split it" in text


async def test_a_declared_length_over_the_limit_is_refused_before_any_byte_is_read():
    upload = Upload(chunks=None)
    declared = str(10 * 2**30).encode()  # 10 GiB
    status, body = await post(upload, [(b"content-length", declared)])
    assert_refused(status, body)
    assert upload.pulled == 0


async def test_a_chunked_body_is_cut_off_just_past_the_limit():
    upload = Upload(chunks=None)  # no Content-Length, and it never ends
    status, body = await post(upload, [(b"transfer-encoding", b"chunked")])
    assert_refused(status, body)
    assert upload.pulled == (LIMIT + FORM_ALLOWANCE_BYTES) // CHUNK + 1


async def test_a_body_within_the_limit_reaches_django():
    # Over the upload limit but within the form allowance: Django answers (the CSRF check here).
    upload = Upload(chunks=(LIMIT + CHUNK) // CHUNK)
    length = str(upload.chunks * CHUNK).encode()
    status, _ = await post(upload, [(b"content-length", length)])
    assert status == 403
    assert upload.pulled == upload.chunks
