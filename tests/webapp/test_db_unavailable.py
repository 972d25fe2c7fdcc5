"""While PostgreSQL is unreachable a page answers 503 with a plain message, never a 500."""

from __future__ import annotations

import pytest
from django.db import OperationalError
from django.http import HttpResponse
from django.test import RequestFactory
from django.urls import reverse

from tests.webapp.outage import database_down
from webapp.middleware import DATABASE_UNAVAILABLE, DatabaseUnavailableMiddleware


def test_a_database_error_in_a_view_is_a_503_with_retry_after():
    middleware = DatabaseUnavailableMiddleware(lambda request: HttpResponse("unused"))
    request = RequestFactory().get("/runs/1/")
    response = middleware.process_exception(request, OperationalError("connection refused"))
    assert response.status_code == 503
    assert response["Retry-After"] == "60"
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response.content.decode() == DATABASE_UNAVAILABLE
    assert "keep training" in DATABASE_UNAVAILABLE


def test_other_errors_are_left_to_django():
    middleware = DatabaseUnavailableMiddleware(lambda request: HttpResponse("unused"))
    request = RequestFactory().get("/")
    assert middleware.process_exception(request, ValueError("a bug")) is None


@pytest.mark.django_db(transaction=True)
def test_pages_answer_503_while_postgresql_is_down_and_200_when_it_is_back(client, owner):
    client.force_login(owner)
    for url in (reverse("experiments:list"), reverse("runs:detail", args=[1])):
        with database_down():
            response = client.get(url)
        assert response.status_code == 503, url
        assert response.content.decode() == DATABASE_UNAVAILABLE
        assert response["Retry-After"] == "60"
    assert client.get(reverse("experiments:list")).status_code == 200
