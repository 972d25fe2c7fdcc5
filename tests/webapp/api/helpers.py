"""An API client with a bearer token, for the API's tests."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from webapp.api.tokens import token_create


class ApiClient:
    """Django's test client sending ``Authorization: Bearer <token>`` and JSON bodies."""

    def __init__(self, token: str) -> None:
        self.client = Client(raise_request_exception=False)
        self.headers = {"Authorization": f"Bearer {token}"}

    def get(self, path: str, params: dict | None = None) -> Any:
        return self.client.get(f"/api{path}", params or {}, headers=self.headers)

    def post(self, path: str, body: dict | None = None) -> Any:
        data = json.dumps(body or {})
        return self.client.post(
            f"/api{path}", data, content_type="application/json", headers=self.headers
        )

    def bare_post(self, path: str) -> Any:
        """POST with no body and no Content-Type, as ``curl -X POST`` sends it."""
        return self.client.generic(
            "POST", f"/api{path}", b"", content_type=None, headers=self.headers
        )

    def upload(self, path: str, data: dict) -> Any:
        return self.client.post(f"/api{path}", data, headers=self.headers)

    def delete(self, path: str) -> Any:
        return self.client.delete(f"/api{path}", headers=self.headers)


def token_of(user: Any) -> str:
    return token_create(owner=user, name="tests")[1]


@pytest.fixture
def api(owner: Any) -> ApiClient:
    """Return an API client holding a token of ``owner`` (alice)."""
    return ApiClient(token_of(owner))


@pytest.fixture
def bob(other_user: Any) -> ApiClient:
    """Return an API client holding a token of another user."""
    return ApiClient(token_of(other_user))


def errors_of(response: Any) -> dict[str | None, str]:
    """Return a JSON error response's messages by key."""
    return {e["key"]: e["message"] for e in response.json()["errors"]}
