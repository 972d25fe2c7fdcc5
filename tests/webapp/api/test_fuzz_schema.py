"""Schemathesis against the API's own OpenAPI schema, as the logged-in owner: never a 500.

Every operation of ``/api/openapi.json`` gets requests generated from its schema (bodies, query
strings, path ids), sent through Django's WSGI handler with the owner's token; the ids are
pointed at the owner's real objects half the time so the requests reach the services, not
only the 404. Each request runs in a savepoint that is rolled back.
"""

from __future__ import annotations

import time

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.webapp.api.helpers import token_of
from tests.webapp.test_permissions import world as world  # noqa: F401  (fixture)

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

EXAMPLES_PER_OPERATION = 15


@pytest.fixture
def same_connection():
    """Keep the test's connection (and its transaction) open across WSGI requests."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def test_no_generated_request_to_any_operation_gets_a_server_error(world, owner, same_connection):  # noqa: F811
    schema = schemathesis.openapi.from_wsgi("/api/openapi.json", WSGIHandler())
    auth = {"Authorization": f"Bearer {token_of(owner)}"}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 19
    failures: list[str] = []
    started = time.monotonic()
    for operation in operations:

        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(), real_ids=st.booleans())
        def call_once(case, real_ids: bool) -> None:
            if real_ids:
                for name in case.path_parameters or {}:
                    case.path_parameters[name] = world[name]
            with transaction.atomic():
                response = case.call(headers=auth)
                transaction.set_rollback(True)
            if response.status_code >= 500:
                failures.append(
                    f"{case.method} {case.formatted_path} {case.query!r}: {response.status_code}"
                )

        call_once()
    assert not failures, "server errors:\n" + "\n".join(failures[:20])
    assert time.monotonic() - started < 120
