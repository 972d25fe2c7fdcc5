"""Hostile query strings get a clear 400, never a server error."""

from __future__ import annotations

import pytest

from tests.webapp.fixtures import make_experiment
from webapp.runs.models import Run, RunStatus

pytestmark = pytest.mark.django_db


def test_a_nul_character_in_any_query_or_form_field_is_refused_with_the_reason(client_in, owner):
    experiment = make_experiment(owner)
    run = Run.objects.create(
        experiment=experiment, owner=owner, number=1, status=RunStatus.SUCCEEDED, config={}
    )
    pages = [
        "/",
        "/datasets/",
        f"/runs/{run.pk}/samples/",
        f"/experiments/{experiment.pk}/",
    ]
    for page in pages:
        for key in ("q", "tag", "status", "name"):
            response = client_in.get(page, {key: "a\x00b"})
            assert response.status_code == 400, (page, key, response.status_code)
            assert f"the query field '{key}' holds a NUL character" in response.content.decode()
        assert client_in.get(page).status_code == 200, page
    response = client_in.post("/experiments/new/", {"name": "x\x00"})
    assert response.status_code == 400
    assert "the form field 'name' holds a NUL character" in response.content.decode()
