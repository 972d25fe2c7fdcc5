"""A live studio for the client's tests: Daphne forked with this test's settings and database,
which a test may stop and start again on the same port (a studio restart)."""

from __future__ import annotations

from functools import partial

import pytest
from channels.testing.live import make_application, set_database_connection

from tests.e2e.browser import ForkedDaphneProcess
from tests.webapp.api.helpers import token_of
from tests.webapp.fixtures import other_user, owner, studio_dirs  # noqa: F401


class LiveStudio:
    """A forked Daphne serving the studio; ``restart`` keeps its port."""

    def __init__(self) -> None:
        self.port: int | None = None
        self.server: ForkedDaphneProcess | None = None

    def start(self) -> None:
        self.server = ForkedDaphneProcess(
            "127.0.0.1",
            partial(make_application, static_wrapper=None),
            setup=set_database_connection,
            port=self.port,
        )
        self.server.start()
        while not self.server.ready.wait(timeout=1):
            assert self.server.is_alive(), "the live server stopped"
        self.port = self.server.port.value

    def stop(self) -> None:
        assert self.server is not None
        self.server.terminate()
        self.server.join()
        self.server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
def studio(studio_dirs, settings):  # noqa: F811
    live = LiveStudio()
    live.start()
    yield live
    if live.server is not None:
        live.stop()


@pytest.fixture
def token(owner):  # noqa: F811
    return token_of(owner)
