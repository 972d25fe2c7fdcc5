"""Request checks every view relies on, done once before any view runs."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest


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
