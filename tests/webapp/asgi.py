"""One request through the studio's ASGI application as daphne hands it over, for the tests that
must see what the server reads and answers below the test client."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import unquote

from webapp.asgi import application


async def asgi_request(
    method: str,
    raw_path: str,
    receive: Callable[[], Awaitable[dict]],
    headers: list[tuple[bytes, bytes]] | None = None,
) -> tuple[int, bytes]:
    """Send ``method raw_path`` with the scope daphne builds (``path``: the raw path
    percent-decoded once, ``raw_path``: the bytes as sent), the body pulled through ``receive``;
    return the status and the body of the answer."""
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": unquote(raw_path),
        "raw_path": raw_path.encode("ascii"),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver"), *(headers or [])],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    await application(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], body
