"""Send a run's live events to its Channels group from the driver, on one event loop.

``async_to_sync`` would start a fresh loop per send and the Redis layer a connection pool per
loop; the driver sends once or twice a step for hours, so the publisher keeps one loop and one
pool for its whole life.

Failure policy: a send that fails is logged and dropped, never raised: live events are a
courtesy, the database is the record, and a page that missed some reconnects with ``?since=``
and reads them from there. After a failure the publisher drops events without trying for a
back-off that doubles from ``backoff_s`` up to ``backoff_max_s``, so a Redis that is down (or a
host that does not answer) costs the training loop one failed send per back-off, not one per
event; the first send after the back-off that succeeds resumes publishing. The layer's pooled
connections go stale when Redis restarts; the layer's host options retry once on a fresh one
(``CHANNEL_LAYERS`` in ``webapp.settings``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from webapp.runs.models import run_group_name

logger = logging.getLogger(__name__)


class RunEventPublisher:
    """Publish ``run.event`` messages to ``run.<id>`` groups through a channel layer."""

    def __init__(
        self,
        layer: Any | None = None,
        timeout_s: float = 5.0,
        *,
        backoff_s: float = 0.5,
        backoff_max_s: float = 5.0,
    ) -> None:
        if layer is None:
            from channels.layers import get_channel_layer

            layer = get_channel_layer()
        self.layer = layer
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.loop = asyncio.new_event_loop()
        self.failures = 0  # sends that failed, over the publisher's life
        self.dropped = 0  # events dropped unsent during a back-off, over the publisher's life
        self.retry_at = 0.0  # time.monotonic() before which no send is tried
        self._delay_s = 0.0  # the current back-off; 0 while sends succeed
        self._dropped_in_outage = 0

    def publish(self, message: dict[str, Any]) -> bool:
        """Send ``message`` (built by ``webapp.runs.events.run_event``); return True on success."""
        if self.layer is None or self.loop.is_closed():
            return False
        if time.monotonic() < self.retry_at:
            self.dropped += 1
            self._dropped_in_outage += 1
            return False
        send = self.layer.group_send(run_group_name(message["run_id"]), message)
        try:
            self.loop.run_until_complete(asyncio.wait_for(send, self.timeout_s))
        except Exception as exc:
            self._failed(message, exc)
            return False
        if self._delay_s:
            logger.warning(
                "run %s: publishing live events again (%d dropped meanwhile)",
                message.get("run_id"),
                self._dropped_in_outage,
            )
            self._delay_s = 0.0
            self._dropped_in_outage = 0
        return True

    def _failed(self, message: dict[str, Any], exc: Exception) -> None:
        self.failures += 1
        self._dropped_in_outage += 1
        self._delay_s = min(max(self.backoff_s, 2 * self._delay_s), self.backoff_max_s)
        self.retry_at = time.monotonic() + self._delay_s
        # One traceback is enough to diagnose; later failures are counted in one line each.
        logger.warning(
            "could not publish %s event of run %s (%d failures; %s); live events are dropped "
            "for %.1f s",
            message.get("event"),
            message.get("run_id"),
            self.failures,
            f"{type(exc).__name__}: {exc}",
            self._delay_s,
            exc_info=self.failures == 1,
        )

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
