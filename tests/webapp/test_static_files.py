"""Static files through the ASGI app, as a deployment serves them: traversal is a 400 or 404.

Never a 500. Each path goes through ``webapp.asgi.application`` with the scope daphne builds
(``path`` is the raw path percent-decoded once, ``raw_path`` the bytes as sent), and through
the test client.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from django.test import Client

from tests.webapp.asgi import asgi_request

pytestmark = pytest.mark.timeout(60)

TRAVERSALS = [
    "/static/../webapp/settings.py",
    "/static/plotly/../../webapp/settings.py",
    "/static/..",
    "/static/%2e%2e/webapp/settings.py",
    "/static/%2E%2E/webapp/settings.py",
    "/static/..%2fwebapp%2fsettings.py",
    "/static/%2e%2e%2f%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    "/static/%252e%252e/webapp/settings.py",  # double encoding: the handler unquotes once more
    "/static/%252e%252e%252fwebapp%252fsettings.py",
    "/static/..%5cwebapp%5csettings.py",
    "/static/..\\webapp\\settings.py",
    "/static//etc/passwd",
    "/static/%2fetc%2fpasswd",
    "/static///work/main/webapp/settings.py",
    "/static/%c0%ae%c0%ae/webapp/settings.py",  # overlong UTF-8 dots
    "/static/a%00b",
]


async def asgi_get(raw_path: str) -> tuple[int, bytes]:
    """GET ``raw_path`` through the ASGI app as daphne would; return the status and body."""
    received = False

    async def receive() -> dict:
        nonlocal received
        if received:
            await asyncio.Event().wait()  # a connected client that sent its whole request
        received = True
        return {"type": "http.request", "body": b"", "more_body": False}

    return await asgi_request("GET", raw_path, receive)


@pytest.mark.parametrize("raw_path", TRAVERSALS)
async def test_a_path_out_of_the_static_folders_is_refused_by_the_asgi_app(raw_path, caplog):
    with caplog.at_level(logging.ERROR, logger="django.security"):
        status, body = await asgi_get(raw_path)
    assert status in (400, 404), (status, body[:300])
    assert b"SECRET_KEY" not in body and b"root:" not in body
    assert b"Traceback" not in body and b"SuspiciousFileOperation" not in body
    if status == 400:  # the finders saw it leave the static folders: logged as Django logs it
        assert [r.name for r in caplog.records] == ["django.security.SuspiciousFileOperation"]


@pytest.mark.parametrize("raw_path", TRAVERSALS)
def test_a_path_out_of_the_static_folders_is_refused_through_the_test_client(raw_path):
    response = Client().get(raw_path)
    assert response.status_code in (400, 404)
    assert b"SECRET_KEY" not in response.content and b"root:" not in response.content


async def test_static_files_are_still_served():
    status, body = await asgi_get("/static/plotly/plotly.min.js")
    assert status == 200 and body.startswith(b"/**") and len(body) > 10**6
