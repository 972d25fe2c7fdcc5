"""Every API error is ``{"errors": [{"key": ..., "message": ...}]}``.

``key`` names what was wrong: a config key (``data.train_batch_size``), a body or query field
(``name``, ``step``), or null for the request as a whole. The messages are the ones the HTML
forms show, from the same services and forms.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django import forms
from ninja import Schema

from engine.config import ConfigError, ConfigFieldError, ConfigValidationError


class ErrorItem(Schema):
    key: str | None
    message: str


class ErrorOut(Schema):
    errors: list[ErrorItem]


class ApiError(Exception):
    """Answer the request with ``status`` and these errors."""

    def __init__(self, status: int, errors: Iterable[tuple[str | None, str]]) -> None:
        self.status = status
        self.errors = [{"key": key, "message": message} for key, message in errors]
        super().__init__("; ".join(f"{e['key']}: {e['message']}" for e in self.errors))


def field_error(key: str | None, message: str, status: int = 400) -> ApiError:
    """Return an ``ApiError`` about one field."""
    return ApiError(status, [(key, message)])


def form_error(form: forms.Form, status: int = 400) -> ApiError:
    """Return the form's errors by field name (null for the form as a whole)."""
    return ApiError(
        status,
        [
            (None if name == forms.forms.NON_FIELD_ERRORS else name, str(message))
            for name, messages in form.errors.items()
            for message in messages
        ],
    )


def config_error(exc: ConfigError, key: str = "config") -> ApiError:
    """Return the config's problems by config key; a problem of the whole text under ``key``."""
    if isinstance(exc, ConfigValidationError):
        return ApiError(400, [(e.key or key, e.message) for e in exc.errors])
    if isinstance(exc, ConfigFieldError) and exc.key:
        return ApiError(400, [(exc.key, exc.message)])
    return ApiError(400, [(key, str(exc))])


def validation_errors(errors: list[dict[str, Any]]) -> list[tuple[str | None, str]]:
    """Return pydantic's errors as (key, message): ``["body", "payload", "name"]`` -> ``name``."""
    items = []
    for error in errors:
        loc = [str(part) for part in error.get("loc", ())]
        if loc and loc[0] in {"body", "query", "path", "form", "file", "header", "cookie"}:
            loc = loc[1:]
        if len(loc) > 1 and loc[0] in {"payload", "filters", "query"}:
            loc = loc[1:]
        items.append((".".join(loc) or None, str(error.get("msg", "invalid value"))))
    return items
