"""Helpers for tests that launch for real: a private Celery broker, a dead one, racing POSTs.

The studio's Redis is shared: a message on its ``celery`` queue would be taken by any worker
listening there. ``private_broker`` sends this process's messages to the same Redis under a key
prefix no worker reads, so a test can count them (``queued_starts``); ``closed_broker`` points
the app at a port nothing listens on, as when Redis is down. Both restore the app afterwards.
``race`` sends POSTs from several clients at the same instant, each on its own connection.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from django.conf import settings
from django.db import connection
from django.test import Client

from workers.celery_app import app


@contextmanager
def _broker(url: str, transport_options: dict) -> Iterator[None]:
    saved = app.conf.broker_url, app.conf.broker_transport_options
    app.conf.broker_url, app.conf.broker_transport_options = url, transport_options
    app._pool, app.amqp._producer_pool = None, None  # the pools hold the old connection
    try:
        yield
    finally:
        if app._pool is not None:
            app._pool.force_close_all()
        app.conf.broker_url, app.conf.broker_transport_options = saved
        app._pool, app.amqp._producer_pool = None, None


@contextmanager
def private_broker() -> Iterator[str]:
    """Send task messages to the studio's Redis under a fresh key prefix; yield the prefix."""
    prefix = f"test-broker-{uuid.uuid4().hex[:12]}:"
    try:
        with _broker(settings.REDIS_URL, {"global_keyprefix": prefix}):
            yield prefix
    finally:
        client = redis.Redis.from_url(settings.REDIS_URL)
        keys = list(client.scan_iter(match=f"{prefix}*"))
        if keys:
            client.delete(*keys)
        client.close()


def queued_starts(prefix: str) -> list[int]:
    """Return the run ids of the ``start_run`` messages waiting under ``prefix``, oldest first."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        raw = client.lrange(f"{prefix}celery", 0, -1)
    finally:
        client.close()
    ids = []
    for item in reversed(raw):  # kombu pushes on the left
        message = json.loads(item)
        assert message["headers"]["task"] == "workers.tasks.start_run"
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        ids.append(args[0])
    return ids


@contextmanager
def closed_broker() -> Iterator[str]:
    """Point the app at a local port nothing listens on; yield its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"redis://127.0.0.1:{port}/0"
    with _broker(url, {}):
        yield url


def race(owner, posts: list[tuple[str, dict]]) -> list[str]:
    """Send each (url, data) POST from its own client of ``owner`` at the same instant.

    Return the pages the redirects end on; each thread has its own database connection.
    """
    barrier, pages = threading.Barrier(len(posts)), []

    def post(url: str, data: dict) -> None:
        client = Client()
        client.force_login(owner)
        try:
            barrier.wait(timeout=10)
            pages.append(client.post(url, data, follow=True).content.decode())
        finally:
            connection.close()

    threads = [threading.Thread(target=post, args=item) for item in posts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(pages) == len(posts), "a request raised; see the thread's traceback above"
    return pages
