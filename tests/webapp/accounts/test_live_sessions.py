"""A run socket answers only pages of this site and lives no longer than its session.

Through the real ASGI stack (``webapp.asgi.application``: origin check, sessions) and the real
Redis channel layer, with a session made by the real log-in form.
"""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.sessions.models import Session
from django.test import Client
from django.urls import reverse

from tests.webapp.live import (  # noqa: F401  (fixtures)
    SOCKET_TEST_MARKS,
    private_redis_layer,
    running_run,
    short_lived_connections,
)
from webapp.asgi import application

pytestmark = SOCKET_TEST_MARKS


def logged_in_client() -> Client:
    client = Client()
    response = client.post(reverse("login"), {"username": "alice", "password": "alice-pass"})
    assert response.status_code == 302
    return client


def socket(run_id: int, client: Client, origin: bytes = b"http://testserver"):
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    headers = [(b"origin", origin), (b"host", b"testserver"), (b"cookie", cookie)]
    return WebsocketCommunicator(application, f"/ws/runs/{run_id}/", headers=headers)


async def open_run_socket(run_id: int, client: Client) -> WebsocketCommunicator:
    communicator = socket(run_id, client)
    connected, _ = await communicator.connect(timeout=10)
    assert connected
    message = await communicator.receive_json_from(timeout=10)
    assert message["type"] == "backlog"
    return communicator


@pytest.fixture
def run(owner):
    return running_run(owner)


async def test_a_socket_from_a_foreign_origin_is_refused(run):
    client = await sync_to_async(logged_in_client)()
    for origin in (b"https://evil.example", b"http://testserver.evil.example"):
        communicator = socket(run.pk, client, origin=origin)
        connected, _ = await communicator.connect(timeout=10)
        assert not connected, origin
    same_host = await open_run_socket(run.pk, client)
    await same_host.disconnect()


async def test_logging_out_closes_every_socket_of_that_session_only(run):
    client = await sync_to_async(logged_in_client)()
    other_client = await sync_to_async(logged_in_client)()  # the same user in another browser
    sockets = [await open_run_socket(run.pk, client) for _ in range(2)]
    other = await open_run_socket(run.pk, other_client)

    await sync_to_async(client.post)(reverse("logout"))
    for communicator in sockets:
        closed = await communicator.receive_output(timeout=10)
        assert closed == {"type": "websocket.close", "code": 4401}
        await communicator.disconnect()
    assert await other.receive_nothing(timeout=0.5)
    await other.disconnect()


async def test_deleting_a_session_closes_its_sockets(run):
    client = await sync_to_async(logged_in_client)()
    communicator = await open_run_socket(run.pk, client)
    key = client.cookies["sessionid"].value
    await sync_to_async(lambda: Session.objects.filter(session_key=key).delete())()
    closed = await communicator.receive_output(timeout=10)
    assert closed == {"type": "websocket.close", "code": 4401}
    await communicator.disconnect()
