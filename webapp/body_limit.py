"""An ASGI middleware that refuses a request body past ``POSTTRAIN_UPLOAD_MAX_BYTES`` as it arrives.

Django's ASGI handler spools the whole body to a temporary file before any upload handler runs,
so ``webapp.datasets.uploads.UploadSizeCapHandler`` alone would let a client fill the server's
disk with one endless request. This middleware counts the ``http.request`` bytes in front of
Django and answers 413 as soon as a declared ``Content-Length`` or the bytes received pass the
setting plus ``FORM_ALLOWANCE_BYTES`` (the multipart framing and the form's other fields), without
reading the rest. A file a little over the limit still reaches the upload handler, which says on
the form which file was too large.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from webapp.datasets.uploads import size_text

FORM_ALLOWANCE_BYTES = 2**20


class BodyTooLarge(Exception):
    """The request body passed the limit while it was being received."""


def body_limit() -> int:
    """Return the most bytes a request body may have (read per request: a changed setting applies)."""
    return settings.POSTTRAIN_UPLOAD_MAX_BYTES + FORM_ALLOWANCE_BYTES


def refusal_text(limit: int) -> str:
    """Return the one-sentence answer to a request whose body is over ``limit`` bytes."""
    return (
        f"The request body is larger than {size_text(limit)}: the limit POSTTRAIN_UPLOAD_MAX_BYTES "
        f"sets plus {size_text(FORM_ALLOWANCE_BYTES)} for the form's other fields; upload a "
        "smaller file (split it) or ask an administrator to raise POSTTRAIN_UPLOAD_MAX_BYTES.\n"
    )


def declared_length(scope: dict[str, Any]) -> int | None:
    """Return the request's ``Content-Length`` as an int, or None when absent or unreadable."""
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length":
            return int(value) if value.strip().isdigit() else None  # bytes: ASCII digits only
    return None


class RequestBodyLimit:
    """Wrap an ASGI HTTP app: answer 413 to a body over :func:`body_limit` before Django spools it."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = body_limit()
        declared = declared_length(scope)
        if declared is not None and declared > limit:
            await self.refuse(send, limit)
            return
        received = 0
        started = False

        async def counted_receive() -> dict[str, Any]:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge
            return message

        async def watched_send(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, watched_send)
        except BodyTooLarge:
            if started:  # a view that streamed its answer while reading: nothing left to say
                raise
            await self.refuse(send, limit)

    @staticmethod
    async def refuse(send: Any, limit: int) -> None:
        body = refusal_text(limit).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
