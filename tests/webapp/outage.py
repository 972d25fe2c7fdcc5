"""Take this process's database away for a moment: its connection points at a port nobody serves."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

from django.db import connection


def closed_port() -> int:
    """Return a local TCP port that nothing listens on (just freed by this process)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def database_down() -> Iterator[None]:
    """Make every query of this thread's connection fail as if PostgreSQL were stopped.

    Only for transactional tests (``django_db(transaction=True)``): the connection is closed.
    """
    port = connection.settings_dict["PORT"]
    connection.close()
    connection.settings_dict["PORT"] = str(closed_port())
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict["PORT"] = port
