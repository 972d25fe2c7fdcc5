"""What every real-browser test shares: Debian's Chromium, its launch flags, the screenshot folder.

Never ``playwright install`` (it downloads a browser): Playwright drives the system's Chromium
with the flags the web benchmarks use too (``bench.web.live_common`` defines both).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from asgiref.sync import SyncToAsync
from channels.testing import ChannelsLiveServerTestCase
from daphne.testing import DaphneProcess

from bench.web.live_common import CHROMIUM, CHROMIUM_ARGS

# Playwright's assertions wait 5 s by default; on a shared 2-core machine a page that is right
# can take longer than that to show it (a first chart while a run trains beside the browser). A
# wrong page still fails, only later.
EXPECT_TIMEOUT_MS = 15_000


def patient_expect() -> None:
    """Give every Playwright ``expect`` without its own timeout :data:`EXPECT_TIMEOUT_MS`."""
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)


def artifacts() -> Path:
    """Return the folder for screenshots: ``$POSTTRAIN_TEST_ARTIFACTS`` or ``test-artifacts/``."""
    folder = Path(os.environ.get("POSTTRAIN_TEST_ARTIFACTS") or "test-artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextmanager
def logged_in_page(
    live_server_url: str, session: str, errors: list[str], **context: Any
) -> Iterator[Any]:
    """Yield a Chromium page holding ``session``'s login cookie; page errors land in ``errors``.

    ``context`` goes to ``new_context`` (a viewport, say). The browser closes on the way out.
    """
    from playwright.sync_api import sync_playwright

    patient_expect()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            browser_context = browser.new_context(**context)
            browser_context.add_cookies(
                [{"name": "sessionid", "value": session, "url": live_server_url}]
            )
            page = browser_context.new_page()
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            yield page
        finally:
            browser.close()


def in_driver_thread(run_id: int, record: Callable[[Any], None]) -> None:
    """Call ``record(recorder)`` with the driver's ``RunRecorder`` from another thread, over the
    channel layer, as a run's driver does (the browser test's own thread runs Playwright)."""
    import threading

    from channels.layers import channel_layers
    from django.db import connection

    from workers.database_recorder import RunRecorder
    from workers.publish import RunEventPublisher

    def drive() -> None:
        publisher = RunEventPublisher(channel_layers.make_backend("default"))
        try:
            record(RunRecorder(run_id, publisher))
        finally:
            publisher.close()
            connection.close()

    thread = threading.Thread(target=drive)
    thread.start()
    thread.join(30)


class ForkedDaphneProcess(DaphneProcess):
    """Daphne in a forked child, with a fresh thread for ``database_sync_to_async``.

    A fork copies the parent's single-thread executor but not its thread: if an earlier test in
    this process used it, every ORM call of the server's consumers would wait forever.
    """

    def run(self):
        from concurrent.futures import ThreadPoolExecutor

        SyncToAsync.single_thread_executor = ThreadPoolExecutor(max_workers=1)
        super().run()


class SyncBrowserTestCase(ChannelsLiveServerTestCase):
    """A live server whose test thread calls the ORM while Playwright's sync API runs an event
    loop in it (Django refuses that unless ``DJANGO_ALLOW_ASYNC_UNSAFE`` is set); the variable
    is restored afterwards."""

    @classmethod
    def setUpClass(cls) -> None:
        cls._async_unsafe = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "1"
        super().setUpClass()

    @classmethod
    def tearDownClass(cls) -> None:
        super().tearDownClass()
        if cls._async_unsafe is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = cls._async_unsafe


class LiveLayerTestCase(SyncBrowserTestCase):
    """A live Daphne (forked) whose channel layer is this test class's own: a private key prefix
    on the shared Redis, or whatever :meth:`channel_layers` returns."""

    ProtocolServerProcess = ForkedDaphneProcess

    @classmethod
    def channel_layers(cls) -> dict:
        """Return the ``CHANNEL_LAYERS`` the server and the test use."""
        from django.conf import settings

        from tests.webapp.live import private_channel_layers

        return private_channel_layers(settings.CHANNEL_LAYERS)

    @classmethod
    def setUpClass(cls) -> None:
        from django.test import override_settings

        cls._layers = override_settings(CHANNEL_LAYERS=cls.channel_layers())
        cls._layers.enable()
        super().setUpClass()

    @classmethod
    def tearDownClass(cls) -> None:
        super().tearDownClass()
        cls._layers.disable()


class LiveBrowserTestCase(LiveLayerTestCase):
    """A live Daphne on a private Redis layer, one Chromium, and a page logged in as ``alice``.

    Each test gets ``self.owner``, ``self.context``, ``self.page`` and ``self.errors`` (the
    page's uncaught errors).
    """

    @classmethod
    def setUpClass(cls):
        import pytest
        from playwright.sync_api import sync_playwright

        if not Path(CHROMIUM).exists():
            pytest.skip(f"{CHROMIUM} is missing; apt-get install chromium")
        super().setUpClass()
        patient_expect()
        cls._playwright = sync_playwright().start()
        cls.browser = cls._playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)

    @classmethod
    def tearDownClass(cls):
        cls.browser.close()
        cls._playwright.stop()
        super().tearDownClass()

    def setUp(self):
        from django.contrib.auth import get_user_model
        from django.test import Client

        self.owner = get_user_model().objects.create_user("alice", password="alice-pass")
        client = Client()
        client.force_login(self.owner)
        self.context = self.browser.new_context(viewport={"width": 1400, "height": 1000})
        session = client.cookies["sessionid"].value
        self.context.add_cookies(
            [{"name": "sessionid", "value": session, "url": self.live_server_url}]
        )
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))

    def tearDown(self):
        self.context.close()


class PrivateStudioBrowserTestCase(LiveBrowserTestCase):
    """A live browser test whose server keeps its data and uploads in a temporary folder and
    sends its runs' start messages on a queue of its own (set before the server forks), so a
    worker of another test never takes them."""

    @classmethod
    def setUpClass(cls):
        import tempfile
        import uuid

        from django.test import override_settings

        from workers.celery_app import app

        cls._data = tempfile.TemporaryDirectory()
        data = Path(cls._data.name)
        cls._dirs = override_settings(POSTTRAIN_DATA_DIR=data, MEDIA_ROOT=data / "uploads")
        cls._dirs.enable()
        cls._queue = app.conf.task_default_queue
        app.conf.task_default_queue = f"posttrain-test-{uuid.uuid4().hex[:12]}"
        super().setUpClass()

    @classmethod
    def tearDownClass(cls):
        from workers.celery_app import app

        super().tearDownClass()
        app.conf.task_default_queue = cls._queue
        cls._dirs.disable()
        cls._data.cleanup()
