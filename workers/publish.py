"""Send a run's live events to its Channels group from the driver, on one event loop.

``async_to_sync`` would start a fresh loop per send and the Redis layer a connection pool per
loop; the driver sends once or twice a step for hours, so the publisher keeps one loop and one
pool for its whole life. A send that fails is logged and dropped: live events are a courtesy,
the database is the record.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from webapp.runs.models import run_group_name

logger = logging.getLogger(__name__)


class RunEventPublisher:
    """Publish ``run.event`` messages to ``run.<id>`` groups through a channel layer."""

    def __init__(self, layer: Any | None = None, timeout_s: float = 5.0) -> None:
        if layer is None:
            from channels.layers import get_channel_layer

            layer = get_channel_layer()
        self.layer = layer
        self.timeout_s = timeout_s
        self.loop = asyncio.new_event_loop()
        self.failures = 0

    def publish(self, message: dict[str, Any]) -> bool:
        """Send ``message`` (built by ``webapp.runs.events.run_event``); return True on success."""
        if self.layer is None or self.loop.is_closed():
            return False
        send = self.layer.group_send(run_group_name(message["run_id"]), message)
        try:
            self.loop.run_until_complete(asyncio.wait_for(send, self.timeout_s))
            return True
        except Exception:
            self.failures += 1
            # One traceback is enough to diagnose; later failures are counted in one line each.
            logger.warning(
                "could not publish %s event of run %s (%d failures)",
                message.get("event"),
                message.get("run_id"),
                self.failures,
                exc_info=self.failures == 1,
            )
            return False

    def close(self) -> None:
        """Close the layer's connections and the loop."""
        if self.loop.is_closed():
            return
        close_pools = getattr(self.layer, "close_pools", None)
        if close_pools is not None:
            try:
                self.loop.run_until_complete(close_pools())
            except Exception:
                logger.debug("closing the channel layer failed", exc_info=True)
        self.loop.close()
