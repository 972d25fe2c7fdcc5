"""Another user never sees or exports a sample: not through a page, an export or a selector."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import get_resolver, reverse

from tests.webapp.samples.conftest import finished_run, records
from webapp.runs.driver_writes import samples_write
from webapp.samples.selectors import (
    SampleFilter,
    sample_across_runs,
    sample_export_rows,
    sample_group,
    sample_page,
    sample_prompt_history,
    sample_steps,
)

pytestmark = pytest.mark.django_db

SECRET = "alice-secret"
# Every inspector page, with the query that shows the owner's samples on it.
QUERIES = {
    "step": "?step=1",
    "steps": "",
    "group": "?step=1&prompt=0",
    "prompt": "?prompt=0",
    "compare": "?prompt=0",
    "run": "",
    "prompts": "",
    "export-jsonl": "",
    "export-csv": "?step=1",
}


@pytest.fixture
def secret_run(owner):
    run = finished_run(owner, name=f"{SECRET} experiment")
    for step in (1, 2):  # the prompt comes back: the recurring prompts page shows it too
        samples_write(
            run_id=run.pk,
            samples=records(
                step, 0, [1.0, 0.0], prompt_text=f"{SECRET} prompt", responses=[SECRET, SECRET]
            ),
        )
    return run


def inspector_names() -> set[str]:
    resolver = next(
        r for r in get_resolver().url_patterns if getattr(r, "namespace", None) == "samples"
    )
    return {pattern.name for pattern in resolver.url_patterns}


def test_every_inspector_url_is_checked_here():
    assert inspector_names() == set(QUERIES)


def test_the_owner_sees_the_secret_on_every_page(secret_run, owner):
    client = Client()
    client.force_login(owner)
    for name, query in QUERIES.items():
        response = client.get(reverse(f"samples:{name}", args=[secret_run.pk]) + query)
        content = b"".join(response.streaming_content) if response.streaming else response.content
        if name != "steps":
            assert SECRET in content.decode(), name


@pytest.mark.parametrize(("method", "status"), [("get", 404), ("head", 404), ("post", 405)])
def test_another_user_gets_no_sample_from_any_page(secret_run, other_user, method, status):
    client = Client()
    client.force_login(other_user)
    for name, query in QUERIES.items():
        url = reverse(f"samples:{name}", args=[secret_run.pk]) + query
        response = getattr(client, method)(url)
        # A POST is refused for every run alike, so its 405 tells nothing about this one.
        assert response.status_code == status, f"{method} {url}"
        assert not response.streaming
        assert SECRET not in response.content.decode(), f"{method} {url}"


def test_an_anonymous_visitor_is_sent_to_log_in(secret_run):
    for name, query in QUERIES.items():
        response = Client().get(reverse(f"samples:{name}", args=[secret_run.pk]) + query)
        assert response.status_code == 302, name
        assert response["Location"].startswith("/accounts/login/")


def test_selectors_return_nothing_of_another_users_run(secret_run, other_user):
    run_id = secret_run.pk
    assert sample_steps(user=other_user, run_id=run_id, split="train") == []
    assert sample_page(user=other_user, run_id=run_id, filters=SampleFilter(step=1)).count == 0
    assert (
        sample_group(user=other_user, run_id=run_id, split="train", step=1, prompt_index=0) is None
    )
    assert (
        sample_prompt_history(user=other_user, run_id=run_id, split="train", prompt_index=0) is None
    )
    rows = sample_export_rows(
        user=other_user, run_id=run_id, filters=SampleFilter(), with_tokens=True
    )
    assert list(rows) == []
    assert (
        sample_across_runs(
            user=other_user,
            reference_run_id=run_id,
            run_ids=[run_id],
            split="train",
            prompt_index=0,
        )
        is None
    )


def test_comparing_with_another_users_run_is_refused(secret_run, owner, other_user):
    mine = finished_run(other_user, name="mallory's run")
    samples_write(run_id=mine.pk, samples=records(1, 0, [0.5]))
    client = Client()
    client.force_login(other_user)
    base = reverse("samples:compare", args=[mine.pk])
    for query in (f"?prompt=0&runs={secret_run.pk}", f"?prompt=0&reference={secret_run.pk}"):
        response = client.get(base + query)
        assert response.status_code == 400
        page = response.content.decode()
        assert f"Run {secret_run.pk} is not one of your runs" in page
        assert SECRET not in page
    # Their own comparison page never lists the owner's run, and the selector drops it.
    page = client.get(base + "?prompt=0").content.decode()
    assert f'value="{secret_run.pk}"' not in page
    result = sample_across_runs(
        user=other_user,
        reference_run_id=mine.pk,
        run_ids=[secret_run.pk],
        split="train",
        prompt_index=0,
    )
    assert [r.run.pk for r in result.runs] == [mine.pk]
