"""The upload size cap, enforced while the request body streams in."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.files.uploadhandler import FileUploadHandler, SkipFile
from django.http import HttpRequest


def size_text(n: int) -> str:
    """Return a byte count as people read it: "512 MiB (536,870,912 bytes)"."""
    return f"{n / 2**20:,.0f} MiB ({n:,} bytes)" if n >= 2**20 else f"{n:,} bytes"


class UploadSizeCapHandler(FileUploadHandler):
    """Drop uploaded files once a request's files pass ``POSTTRAIN_UPLOAD_MAX_BYTES``.

    Installed first in ``FILE_UPLOAD_HANDLERS``, it sees each chunk before Django's memory and
    temporary-file handlers do. Raising ``SkipFile`` makes the parser close (so delete) the
    partial temporary file and discard the rest of that file's bytes as they arrive: nothing past
    the limit is kept in memory or on disk. The refusal stays on the handler for the view to show
    (``upload_refusals``). The limit is read per request, so a changed setting applies at once.
    """

    def __init__(self, request: HttpRequest | None = None) -> None:
        super().__init__(request)
        self.limit: int = settings.POSTTRAIN_UPLOAD_MAX_BYTES
        self.received = 0
        self.refused: dict[str, str] = {}

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes:
        self.received += len(raw_data)
        if self.received > self.limit:
            self.refused[self.field_name] = (
                f"{self.file_name} is larger than {size_text(self.limit)}, the limit "
                "POSTTRAIN_UPLOAD_MAX_BYTES sets; upload a smaller file (split it) or ask an "
                "administrator to raise the limit"
            )
            raise SkipFile
        return raw_data

    def file_complete(self, file_size: int) -> Any:
        return None


def upload_refusals(request: HttpRequest) -> dict[str, str]:
    """Return, for each form field whose file was dropped while uploading, the reason."""
    return {
        field: message
        for handler in request.upload_handlers
        if isinstance(handler, UploadSizeCapHandler)
        for field, message in handler.refused.items()
    }
