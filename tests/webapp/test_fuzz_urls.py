"""Random query strings and form bodies on every URL, as the logged-in owner: never a 500.

The walker of the ownership test enumerates the URL patterns, so a new page is fuzzed the day it
is added. Each URL gets random values for the field names its own page renders (``name="..."``)
and for the query keys the views read, drawn from hostile text: numbers past 64 bits, NaN and
infinities, path traversal, interpolations, YAML anchors, markup, NUL. Every example runs in a
savepoint that is rolled back, so a POST that deletes an object does not starve the next one.
"""

from __future__ import annotations

import re

import pytest
from django.db import transaction
from django.test import Client
from django.urls import get_resolver, reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.webapp.test_permissions import kwarg_names, walk
from tests.webapp.test_permissions import world as world  # noqa: F401  (fixture)

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

# Query keys the list, chart, inspector and comparison views read.
QUERY_KEYS = (
    "q", "tag", "status", "archived", "preset", "other", "name", "run", "tokens", "format",
    "step", "split", "group", "prompt", "min_reward", "max_reward", "page", "sort", "metric",
    "max_points", "a", "b",
)  # fmt: skip
HOSTILE = (
    "", "0", "-1", "1e309", "nan", "inf", "-inf", str(2**31), str(2**63), str(-(2**63) - 1),
    str(10**30), "0x10", "1_000", " 7 ", "true", "on", "../../etc/passwd", "/etc/passwd",
    "${oc.env:DJANGO_SECRET_KEY}", "${data.train_files}", "*a", "&a [1, 2]", "[", "{", "}",
    "[[[[[[[[", "<script>alert(1)</script>", "'; DROP TABLE runs_run; --", "%", "%00", "\x00",
    "\u202e", "x" * 5000, "tiny://../../etc", "file:///etc/passwd",
)  # fmt: skip
VALUES = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(max_size=40),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
EXAMPLES_PER_URL = 12


def form_field_names(html: str) -> list[str]:
    """Return the field names a page renders (inputs, selects and text areas)."""
    return sorted(set(re.findall(r'\bname="([^"]+)"', html)) - {"csrfmiddlewaretoken"})


def fuzzable_urls(world: dict) -> list[tuple[str, str]]:
    """Return (name, url) for every named URL pattern outside the admin, with the owner's objects."""
    urls = []
    for name, chain in walk(get_resolver().url_patterns):
        if name is None or str(chain[0].pattern) == "admin/":
            continue
        names = kwarg_names(chain)
        urls.append((name, reverse(name, kwargs={k: world[k] for k in names})))
    return urls


def test_no_random_query_or_form_body_on_any_url_gets_a_server_error(world, owner):  # noqa: F811
    client = Client(raise_request_exception=False)
    client.force_login(owner)
    failures: list[str] = []
    urls = fuzzable_urls(world)
    assert len(urls) > 30
    for name, url in urls:
        fuzz_one_url(client, name, url, failures)
    assert not failures, "server errors:\n" + "\n".join(failures[:20])


def fuzz_one_url(client: Client, name: str, url: str, failures: list[str]) -> None:
    """Send random GETs and POSTs to ``url``; append a line to ``failures`` for each 5xx."""
    page = client.get(url)
    html = page.content.decode(errors="replace") if page.status_code == 200 else ""
    keys = st.sampled_from(sorted(set(form_field_names(html)) | set(QUERY_KEYS)))

    @settings(
        max_examples=EXAMPLES_PER_URL,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(method=st.sampled_from(["get", "post"]), data=st.dictionaries(keys, VALUES, max_size=6))
    def request_once(method: str, data: dict[str, str]) -> None:
        with transaction.atomic():
            response = getattr(client, method)(url, data)
            transaction.set_rollback(True)
        if response.status_code >= 500:
            failures.append(f"{method.upper()} {url} ({name}) {data!r}: {response.status_code}")

    request_once()


def test_the_builder_with_hostile_values_in_valid_fields_never_gets_a_server_error(owner):
    """Start from the tiny preset's valid form and replace up to four fields, saving or launching."""
    from tests.webapp.fixtures import builder_data, tiny_config

    client = Client(raise_request_exception=False)
    client.force_login(owner)
    valid = builder_data(tiny_config(), owner)
    valid.pop("launch")
    fields = sorted(valid)
    failures: list[str] = []

    @settings(
        max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(
        url=st.sampled_from(["/experiments/new/", "/experiments/new/preview/"]),
        changes=st.dictionaries(st.sampled_from(fields), VALUES, min_size=1, max_size=4),
        launch=st.booleans(),
    )
    def post_once(url: str, changes: dict[str, str], launch: bool) -> None:
        data = {**valid, **changes, **({"launch": "on"} if launch else {})}
        with transaction.atomic():
            response = client.post(url, data)
            transaction.set_rollback(True)
        if response.status_code >= 500:
            failures.append(f"POST {url} {changes!r}: {response.status_code}")

    post_once()
    assert not failures, "server errors:\n" + "\n".join(failures[:20])
