"""The API's rate limit against the real Redis: the request past the limit in a window is a 429.

The clock is pinned (``webapp.api.throttle._now``) so a window never ends in the middle of a
test, and each test counts under its own cache key prefix so no other test's requests count.
"""

from __future__ import annotations

import logging
import uuid

import httpx
import pytest
import redis
from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections

from posttrain_client import Studio, StudioError
from tests.webapp.api.helpers import ApiClient, errors_of, token_of
from tests.webapp.test_settings_deploy import manage
from webapp.api import throttle
from webapp.api.rates import Rate, parse_rate

pytestmark = pytest.mark.django_db

START = 6_000_000_040.0  # 40 s into a minute


@pytest.fixture
def limit(settings, monkeypatch):
    """Allow 3 requests a minute, counted under a fresh prefix, with the clock at ``START``."""
    settings.POSTTRAIN_API_RATE = "3/min"
    prefix = uuid.uuid4().hex
    settings.CACHES = {
        **settings.CACHES,
        throttle.CACHE: {**settings.CACHES[throttle.CACHE], "KEY_PREFIX": prefix},
    }
    clock = {"now": START, "prefix": prefix}
    monkeypatch.setattr(throttle, "_now", lambda: clock["now"])
    return clock


def test_the_counters_live_in_redis():
    assert isinstance(caches[throttle.CACHE], RedisCache)


def test_the_request_past_the_limit_gets_429_and_other_tokens_do_not(
    limit, settings, owner, other_user
):
    first, second = ApiClient(token_of(owner)), ApiClient(token_of(owner))
    bob = ApiClient(token_of(other_user))
    assert [first.get("/experiments").status_code for _ in range(3)] == [200, 200, 200]
    refused = first.get("/experiments")
    assert refused.status_code == 429
    assert refused["Retry-After"] == "20"  # the minute's 20 seconds left
    assert errors_of(refused) == {
        None: "too many requests: this token may send 3 requests per minute; wait 20 s "
        "(Retry-After) and space the requests out"
    }
    assert first.post("/experiments", {"name": "x"}).status_code == 429  # every method counts
    # Another token of the same user and another user's token have their own counts.
    assert second.get("/experiments").status_code == 200
    assert bob.get("/experiments").status_code == 200

    counters = redis.Redis.from_url(settings.REDIS_URL)
    keys = counters.keys(f"{limit['prefix']}:*")
    assert len(keys) == 3  # one window of each token
    assert all(0 < counters.ttl(key) <= 61 for key in keys)  # each expires after its minute
    limit["now"] = START + 19.5
    assert first.get("/experiments")["Retry-After"] == "1"
    limit["now"] = START + 20  # the next minute
    assert first.get("/experiments").status_code == 200


def test_a_browser_session_is_counted_per_user(limit, client_in, owner):
    assert [client_in.get("/api/experiments").status_code for _ in range(3)] == [200] * 3
    refused = client_in.get("/api/experiments")
    assert refused.status_code == 429 and refused["Retry-After"] == "20"
    assert "your session may send 3 requests per minute" in errors_of(refused)[None]
    assert ApiClient(token_of(owner)).get("/experiments").status_code == 200


def test_without_redis_the_api_still_answers(settings, owner, caplog, monkeypatch):
    settings.POSTTRAIN_API_RATE = "1/min"
    settings.CACHES = {
        **settings.CACHES,
        throttle.CACHE: {**settings.CACHES[throttle.CACHE], "LOCATION": "redis://127.0.0.1:1/0"},
    }
    monkeypatch.setattr(throttle, "_warned_at", float("-inf"))
    client = ApiClient(token_of(owner))
    with caplog.at_level(logging.WARNING, logger="webapp.api.throttle"):
        assert [client.get("/experiments").status_code for _ in range(3)] == [200] * 3
    warnings = [r.getMessage() for r in caplog.records if r.name == "webapp.api.throttle"]
    assert len(warnings) == 1 and "Redis cannot be reached" in warnings[0]  # once, not per request


def test_rates_are_read_with_their_period():
    assert parse_rate("600/min") == Rate(600, 60)
    assert parse_rate(" 5 / S ") == Rate(5, 1)
    assert parse_rate("10000/day") == Rate(10000, 86400)
    assert str(parse_rate("2/hour")) == "2 requests per hour"
    for bad in ("600", "0/min", "fast/min", "600/fortnight", "-1/s", "6e2/min"):
        with pytest.raises(ValueError, match="e.g. 600/min"):
            parse_rate(bad)


@pytest.mark.slow
def test_a_bad_rate_stops_the_settings_from_loading():
    result = manage("check", DJANGO_DEBUG="1", POSTTRAIN_API_RATE="600/fortnight")
    assert result.returncode != 0
    assert (
        "ImproperlyConfigured: POSTTRAIN_API_RATE='600/fortnight' is not a rate; write "
        "requests/period with at least 1 request and a period of s, min, hour or day, e.g. 600/min"
    ) in result.stderr


def test_the_client_raises_the_429_with_its_retry_after(limit, owner):
    """``posttrain_client`` over Django's own WSGI handler, in this test's transaction."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    transport = httpx.WSGITransport(app=WSGIHandler())
    try:
        with Studio("http://testserver", token_of(owner), transport=transport) as studio:
            assert [studio.experiments.list() for _ in range(3)] == [[], [], []]
            with pytest.raises(StudioError) as exc:
                studio.experiments.list()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)
    assert exc.value.status == 429 and exc.value.retry_after == 20
    assert "this token may send 3 requests per minute" in str(exc.value)
