"""Who may call the API: a personal token (hashed, shown once, revocable) or the session + CSRF."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from tests.webapp.api.helpers import ApiClient, errors_of
from tests.webapp.fixtures import make_experiment
from webapp.api.models import ApiToken

pytestmark = pytest.mark.django_db


def make_token(client: Client, name: str = "laptop") -> str:
    page = client.post("/accounts/tokens/", {"name": name}).content.decode()
    return re.search(r'<pre id="new-token">([^<]+)</pre>', page).group(1)


def test_a_token_is_shown_once_stored_hashed_and_works_until_revoked(client_in, owner):
    secret = make_token(client_in)
    token = ApiToken.objects.get(owner=owner)
    assert secret.startswith("pts_") and len(secret) > 40
    assert secret not in {token.digest, token.prefix} and token.digest != secret
    assert secret.startswith(token.prefix)
    listing = client_in.get("/accounts/tokens/").content.decode()
    assert "laptop" in listing and secret not in listing

    api = ApiClient(secret)
    assert api.get("/experiments").status_code == 200
    token.refresh_from_db()
    assert token.last_used_at is not None

    client_in.post(f"/accounts/tokens/{token.pk}/revoke/")
    assert not ApiToken.objects.exists()
    refused = api.get("/experiments")
    assert refused.status_code == 401 and refused["WWW-Authenticate"] == "Bearer"
    assert "revoked" in errors_of(refused)[None]


def test_no_credentials_a_wrong_token_or_an_inactive_user_get_401(owner):
    assert Client().get("/api/experiments").status_code == 401
    assert ApiClient("pts_not-a-token").get("/experiments").status_code == 401
    secret = make_token(_logged_in(owner))
    owner.is_active = False
    owner.save()
    assert ApiClient(secret).get("/experiments").status_code == 401


def _logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_token_page_needs_a_login_and_refuses_an_empty_name(client_in, owner, other_user):
    assert Client().get("/accounts/tokens/").status_code == 302
    assert client_in.post("/accounts/tokens/", {"name": " "}).status_code == 400
    other = _logged_in(other_user)
    make_token(client_in)
    token = ApiToken.objects.get()
    assert other.post(f"/accounts/tokens/{token.pk}/revoke/").status_code == 404
    assert ApiToken.objects.filter(pk=token.pk).exists()


def test_a_session_needs_the_csrf_token_for_unsafe_methods(owner):
    experiment = make_experiment(owner)
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    assert client.get("/api/experiments").json()["count"] == 1
    url = f"/api/experiments/{experiment.pk}/archive"
    refused = client.post(url, "{}", content_type="application/json")
    assert refused.status_code == 403
    experiment.refresh_from_db()
    assert not experiment.archived
    page = client.get("/accounts/tokens/").content.decode()
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    allowed = client.post(url, "{}", content_type="application/json", headers={"X-CSRFToken": csrf})
    assert allowed.status_code == 200 and allowed.json()["archived"] is True


def test_the_schema_and_docs_page_are_served_without_a_cdn():
    schema = Client().get("/api/openapi.json").json()
    assert schema["openapi"].startswith("3.")
    assert {"/api/experiments", "/api/runs/{run_id}/metrics", "/api/datasets"} <= set(
        schema["paths"]
    )
    docs = Client().get("/api/docs").content.decode()
    assert "/static/ninja/swagger-ui-bundle.js" in docs and "cdn" not in docs.lower()
