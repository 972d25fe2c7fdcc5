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


XSS = "<script>alert(1)</script>"
XSS_IMG = '"><img src=x onerror=alert(2)>'


def test_hostile_text_an_external_run_sends_is_escaped_on_every_page(client_in, owner):
    """What a trainer outside the studio sends (samples, metrics, config keys and values, where
    it lives, its log) reaches each page as text, never as markup."""
    from tests.webapp.api.helpers import ApiClient, token_of
    from webapp.external.services import prompt_index_of

    api = ApiClient(token_of(owner))
    created = api.post(
        "/external-runs",
        {
            "key": "h" * 16,
            "name": f"exp {XSS}",
            "source": "verl",
            "location": f"host {XSS_IMG}",
            "client": XSS,
            "tags": ["ok"],
            "config": {"trainer": {XSS: XSS_IMG, "project_name": XSS}, XSS_IMG: {"a": 1}},
        },
    ).json()
    run_id = created["id"]
    prompt = f"prompt {XSS}"
    sample = {
        "step": 1, "prompt": prompt, "response": f"response {XSS_IMG}", "reward": 1.0,
        "sample_index": 0, "reward_parts": {XSS: 1.0, "pred": XSS_IMG}, "ground_truth": XSS,
        "data_source": XSS[:100], "tokens": [XSS, XSS_IMG], "token_logprobs": [-0.5, -1.0],
    }  # fmt: skip
    assert api.post(f"/external-runs/{run_id}/samples", {"samples": [sample]}).status_code == 200
    steps = {"steps": [{"step": 1, "metrics": {f"actor/{XSS}": 1.0, "critic/score/mean": 0.5}}]}
    assert api.post(f"/external-runs/{run_id}/steps", steps).status_code == 200
    logs = api.post(f"/external-runs/{run_id}/logs", {"offset": 0, "lines": [XSS]})
    assert logs.status_code == 200
    other = Run.objects.create(
        experiment=make_experiment(owner), owner=owner, number=1, status="succeeded", config={}
    )
    index = prompt_index_of(prompt)
    pages = [
        f"/runs/{run_id}/",
        "/runs/",
        f"/runs/?metric=last:actor/{XSS}",
        f"/runs/compare/?run={run_id}&run={other.pk}",
        f"/runs/{run_id}/diff/{other.pk}/",
        f"/runs/{run_id}/samples/?step=1",
        f"/runs/{run_id}/samples/group/?step=1&prompt={index}",
        f"/runs/{run_id}/samples/prompt/?prompt={index}",
        f"/experiments/{created['experiment_id']}/",
        "/",
    ]
    for page in pages:
        response = client_in.get(page)
        assert response.status_code == 200, page
        body = response.content.decode()
        for raw in (XSS, XSS_IMG, "<img src=x"):
            assert raw not in body, (page, raw)
    detail = client_in.get(f"/runs/{run_id}/").content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in detail  # shown, as text
    assert "host &quot;&gt;&lt;img src=x onerror=alert(2)&gt;" in detail
