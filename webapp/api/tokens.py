"""API tokens: create (the secret is returned once), list, revoke, and find a token's user.

A token is ``pts_`` and 43 URL-safe characters (256 random bits). Only its SHA-256 digest is
stored: a random secret that long needs no slow hash, and a lookup by digest is one indexed
query. A leaked database gives no usable token.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from webapp.api.models import ApiToken

TOKEN_PREFIX = "pts_"
MAX_TOKENS_PER_USER = 20
# ``last_used_at`` is written at most this often per token, not on every request.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class TokenRefused(ValueError):
    """The token cannot be made; the message says why and what to do."""


def token_digest(raw: str) -> str:
    """Return the SHA-256 hex digest of the token ``raw``, the form the database keeps."""
    return hashlib.sha256(raw.encode()).hexdigest()


def token_list_for_user(*, user: Any) -> QuerySet[ApiToken]:
    """Return ``user``'s tokens, newest first."""
    return ApiToken.objects.filter(owner=user)


def token_create(*, owner: Any, name: str) -> tuple[ApiToken, str]:
    """Make a token for ``owner``; return it and its secret, which is never shown again."""
    name = name.strip()
    if not name:
        raise TokenRefused("name the token (what it is for, e.g. 'laptop'), then create it")
    if token_list_for_user(user=owner).count() >= MAX_TOKENS_PER_USER:
        raise TokenRefused(
            f"you have {MAX_TOKENS_PER_USER} tokens, the most one user may hold; revoke one first"
        )
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        owner=owner, name=name[:100], prefix=raw[: len(TOKEN_PREFIX) + 6], digest=token_digest(raw)
    )
    return token, raw


def token_revoke(*, token: ApiToken) -> None:
    """Revoke ``token``: requests that carry it are refused from now on."""
    token.delete()


def token_user(raw: str) -> Any | None:
    """Return the active user whose token ``raw`` is, or None; note when it was last used."""
    if not raw.startswith(TOKEN_PREFIX):
        return None
    token = ApiToken.objects.select_related("owner").filter(digest=token_digest(raw)).first()
    if token is None or not token.owner.is_active:
        return None
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.owner
