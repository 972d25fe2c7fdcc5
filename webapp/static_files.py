"""Static files served by the ASGI app itself, as a deployment does (``POSTTRAIN_SERVE_STATIC``).

Django's ``ASGIStaticFilesHandler`` answers a missing file with a 404 but lets every other error
through to the server, and a path that leaves the static folders (``/static/../webapp/settings.py``,
``%2e%2e``, ``..%2f``, double encoding: it unquotes the path once more) raises
``SuspiciousFileOperation`` in the finders: a 500 with a traceback. This handler answers it as
Django answers a suspicious request anywhere else: a 400, logged on ``django.security``.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.exceptions import SuspiciousOperation
from django.core.handlers.exception import response_for_exception
from django.http import HttpRequest, HttpResponseBase


class StaticFilesHandler(ASGIStaticFilesHandler):
    """Serve ``STATIC_URL``; a path outside the static folders is a 400, never a 500."""

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        try:
            return await super().get_response_async(request)
        except SuspiciousOperation as exc:
            return await sync_to_async(response_for_exception, thread_sensitive=False)(request, exc)
