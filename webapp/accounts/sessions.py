"""Live sockets end with their session: logging out, or deleting the session, closes them.

A run socket joins the channel group ``session.<session key>`` when it connects
(``webapp.runs.consumers``). When the session ends, one message to that group closes every socket
opened with it, so a browser tab left open after logging out elsewhere stops receiving the run at
once instead of streaming until it is closed. A session ends when its user logs out
(``user_logged_out``) or its row is deleted: an administrator deleting it, ``manage.py
clearsessions`` removing expired ones, or a new session key replacing it (log-in, password change).
Checking the session on every forwarded event would cost a query per event; one group message per
ended session costs nothing while sessions live.
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

logger = logging.getLogger(__name__)

SESSION_ENDED = "session.ended"  # handled by the consumer's ``session_ended``


def session_group_name(session_key: str) -> str:
    """Return the channel group of the live sockets opened with session ``session_key``."""
    return f"session.{session_key}"


def session_sockets_close(*, session_key: str) -> None:
    """Tell every live socket of session ``session_key`` to close.

    A layer that cannot be reached is logged, not raised: the log-out (or deletion) that called
    this must still end the session itself.
    """
    try:
        async_to_sync(get_channel_layer().group_send)(
            session_group_name(session_key), {"type": SESSION_ENDED}
        )
    except Exception:
        logger.exception("could not close the live sockets of an ended session")


def close_sockets_on_logout(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    """``user_logged_out`` receiver: the session is still the one being ended."""
    session_key = getattr(getattr(request, "session", None), "session_key", None)
    if session_key:
        session_sockets_close(session_key=session_key)


def close_sockets_on_session_delete(sender: Any, instance: Any, **kwargs: Any) -> None:
    """``post_delete`` receiver for the session rows."""
    session_sockets_close(session_key=instance.session_key)
