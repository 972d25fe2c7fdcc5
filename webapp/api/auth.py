"""How an API request proves who sends it: a personal token, or the browser's session.

``Authorization: Bearer <token>`` is tried first (no CSRF check: a browser never adds that
header on its own); without it the session cookie counts, and then an unsafe method needs the
CSRF token as every form of the studio does (``X-CSRFToken`` header). Either way the user
becomes ``request.user``, so services see the same user as the HTML views do. A token's
digest is kept as ``request.api_token_digest``: the rate limit counts per token
(``webapp.api.throttle``).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja.security import HttpBearer, SessionAuth

from webapp.api.tokens import token_digest, token_user


class TokenAuth(HttpBearer):
    """A personal API token made on the tokens page (``/accounts/tokens/``)."""

    def authenticate(self, request: HttpRequest, token: str) -> Any | None:
        user = token_user(token)
        if user is not None:
            request.user = user
            request.api_token_digest = token_digest(token)  # type: ignore[attr-defined]
        return user


class BrowserSession(SessionAuth):
    """The logged-in browser's session cookie, with Django's CSRF check on unsafe methods."""

    def authenticate(self, request: HttpRequest, key: str | None) -> Any | None:
        user = request.user
        return user if user.is_authenticated and user.is_active else None


API_AUTH = [TokenAuth(), BrowserSession()]
