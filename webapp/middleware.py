"""Request checks every view relies on, done once before any view runs; the answer when the
database cannot be reached."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from django.db import DatabaseError, InterfaceError, OperationalError, connection
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest

logger = logging.getLogger(__name__)


class RejectNulMiddleware:
    """Answer 400 to a request whose query or form fields hold a NUL character.

    PostgreSQL text cannot hold NUL, so a ``?q=%00`` reaching a filter raised a database error
    (an HTTP 500) in every list and search view. No field of the studio means anything with a
    NUL in it; refusing it here, with the reason, keeps each view from having to.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        for source, fields in (("query", request.GET), ("form", request.POST)):
            for key, values in fields.lists():
                if "\x00" in key or any("\x00" in value for value in values):
                    return HttpResponseBadRequest(
                        f"the {source} field {key.replace(chr(0), '?')!r} holds a NUL character, "
                        "which no field accepts; remove it and send the request again",
                        content_type="text/plain; charset=utf-8",
                    )
        return self.get_response(request)


DATABASE_UNAVAILABLE = (
    "The database is not reachable right now; your runs keep training and their steps will "
    "appear when it is back. Try again in a minute.\n"
)


class DatabaseUnavailableMiddleware:
    """Answer 503 with a plain message, not 500, when a view cannot reach PostgreSQL.

    The run drivers buffer their steps through an outage (``workers.database_recorder``), so nothing is
    lost: the page only has to say so and when to come back (``Retry-After``).
    """

    RETRY_AFTER_S = 60

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, (OperationalError, InterfaceError)):
            return None
        logger.warning("database unreachable on %s: %s", request.path, exception)
        # A broken connection stays broken; the next request opens a new one.
        with contextlib.suppress(DatabaseError):
            connection.close()
        response = HttpResponse(
            DATABASE_UNAVAILABLE, status=503, content_type="text/plain; charset=utf-8"
        )
        response["Retry-After"] = str(self.RETRY_AFTER_S)
        return response
