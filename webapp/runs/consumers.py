"""The live socket of a run (``/ws/runs/<id>/``): its backlog from PostgreSQL, then its events.

On connect the consumer checks who asks (anonymous: close 4401; no right to read the run in
``webapp.projects.access``: close 4403, the same answer for a run that does not exist; origins other than ``ALLOWED_HOSTS`` are refused before,
by ``webapp.asgi``), joins its session's group (when the session ends, by a log-out or its
deletion, the socket closes with 4401: see ``webapp.accounts.sessions``), its user's access group
(a right taken away, such as a removal from the run's project, closes it with 4403 at once) and
the group ``run.<id>``, and only then reads the backlog, so no step recorded in between is lost; a step
that arrives twice is sent once, since the consumer forwards only steps after the last one it
sent. The backlog comes as the score series first (one cheap query, so the first chart draws
at once), then every other series up to the same step, in messages under Daphne's 1 MiB limit.
A client that reconnects passes ``?since=<last step>`` (or sends ``{"since_step": N}`` at any
time) and gets exactly the steps after N, not the backlog again.

A client that passes ``?log=`` (or ``?log=<byte offset>`` when it reconnects) also gets the run's
own log (``webapp.runs.logs``): its tail, then what the driver writes, read from the file every
``LOG_POLL_S`` while the socket is open. The log goes over the run's socket only, so it is read
by those who may read the run (``webapp.projects.access``), as everything else on it.

When the channel layer loses Redis (a restart, a network cut) the socket closes with 4503: its
group memberships lived in Redis and may be gone, so a socket kept open could stay silent for
good. The page reconnects with ``?since=`` and reads the steps it missed from PostgreSQL.

Messages to the browser (JSON, ``type`` first):

- ``backlog``: ``run`` (id, status, progress...), ``panels``, ``series`` (see
  ``webapp.runs.metrics.run_metric_series``), ``last_step``, ``complete`` (true on the last)
- ``metrics``: ``points`` ``[{"step", "time", "metrics"}]``, ``progress``, and ``panels`` when
  a metric name appears for the first time
- ``status`` (on each status change and driver heartbeat, read afresh from PostgreSQL):
  ``run`` as in the backlog (``webapp.runs.state.run_state``, as the page's first paint), which
  every ``metrics`` message carries too; ``samples``: ``step``, ``split``, ``count``,
  ``reward_mean``; ``error``: ``message`` for a request the consumer could not read
- ``health``: ``alerts`` ``[{"check", "label", "step", "message"}]`` of a health check that
  fired (``webapp.health``); the last backlog message, and the status message of a ``?since=``
  connect, carry every stored alert as ``health``
- ``checkpoints``: an export or evaluation of one of the run's checkpoints was queued, started or
  ended (``webapp.runs.checkpoints``); the page reads its checkpoints section again
- ``log`` (with ``?log=``): ``text`` (whole lines), ``offset`` (the byte to ask from after a
  reconnect), ``skipped`` (bytes left out: the reader was far behind), ``reset`` (the file is
  new: forget the lines held)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from webapp.accounts.sessions import session_group_name
from webapp.health.selectors import health_alerts_of_run
from webapp.projects.access import access_user_group, run_visible_to
from webapp.runs.logs import log_read, run_log_path
from webapp.runs.metrics import (
    DEFAULT_MAX_POINTS,
    HEADLINE_METRICS,
    chunk_series,
    epoch_seconds,
    metric_panels,
    run_metric_names,
    run_metric_points_since,
    run_metric_series,
)
from webapp.runs.models import Run, run_group_name
from webapp.runs.progress import run_progress_of
from webapp.runs.state import run_state

logger = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_LAYER_UNAVAILABLE = 4503  # Redis is unreachable: reconnect (WebSocket's 1011 is Daphne's)
# Daphne refuses messages over 1 MiB: a backlog message carries at most this many points
# (about 0.5 MB of JSON), a catch-up message at most this many steps of 50-odd metrics.
BACKLOG_POINTS_PER_MESSAGE = 12_000
SINCE_POINTS_PER_MESSAGE = 200
LOG_POLL_S = 1.0  # how often a followed log is read again


def run_for_owner(*, user: Any, run_id: int) -> Run | None:
    """Return the run if ``user`` may read it (``webapp.projects.access``), else None."""
    return run_visible_to(user, run_id)


def _log_offset(value: str) -> int | None:
    """Return a client's log offset (None: send the tail), or raise ValueError naming the fix."""
    if value == "":
        return None
    if not value.isdecimal():
        raise ValueError(f"log={value!r} is not a byte offset; send log= or a whole number >= 0")
    return int(value)


def _since(value: Any) -> int:
    """Return a client's last step as an int >= 0, or raise ValueError naming the fix."""
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).isdecimal():
        raise ValueError(f"since_step={value!r} is not a step; send a whole number >= 0")
    return int(value)


class RunLiveConsumer(AsyncJsonWebsocketConsumer):
    """Stream one run's metrics, status and sample batches to its owner's browser."""

    run: Run | None = None
    last_step: int | None = None
    session_group: str | None = None
    access_group: str | None = None
    closed_for_session: bool = False
    log_task: asyncio.Task | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            # One line, not one traceback per open page; the browser reconnects on this code.
            logger.warning("run socket closed with 4503: the channel layer lost Redis (%s)", exc)
            with contextlib.suppress(Exception):  # the client may be gone already
                await send({"type": "websocket.close", "code": CLOSE_LAYER_UNAVAILABLE})

    async def connect(self) -> None:
        # Accept first so the browser sees the close code (a refused handshake shows none).
        await self.accept()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        # Logging out (or deleting the session) closes this socket: webapp.accounts.sessions.
        self.session_group = session_group_name(self.scope["session"].session_key)
        await self.channel_layer.group_add(self.session_group, self.channel_name)
        run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        # A change of the user's rights (removed from the run's project...) closes it too.
        self.access_group = access_user_group(user.pk)
        await self.channel_layer.group_add(self.access_group, self.channel_name)
        self.run = await database_sync_to_async(run_for_owner)(user=user, run_id=run_id)
        if self.run is None:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.known_names: set[str] = set()
        await self.channel_layer.group_add(run_group_name(run_id), self.channel_name)
        query = parse_qs(self.scope.get("query_string", b"").decode(), keep_blank_values=True)
        try:
            since = _since(query["since"][0]) if "since" in query else None
        except ValueError as exc:
            await self.send_json({"type": "error", "message": str(exc)})
            since = None
        try:
            log_offset = _log_offset(query["log"][0]) if "log" in query else False
        except ValueError as exc:
            await self.send_json({"type": "error", "message": str(exc)})
            log_offset = None
        if since is None:
            await self.send_backlog()
        else:
            names = await database_sync_to_async(run_metric_names)(run_id=run_id)
            self.known_names.update(names)
            health = await database_sync_to_async(health_alerts_of_run)(run_id=run_id)
            await self.send_json(
                {
                    "type": "status",
                    "run": run_state(self.run),
                    "progress": self._progress(),
                    "health": health,
                }
            )
            await self.send_since(since)
        if log_offset is not False:
            self.log_task = asyncio.create_task(self.follow_log(log_offset))

    async def follow_log(self, offset: int | None) -> None:
        """Send the log after byte ``offset`` (its tail for None), then what is added to it."""
        path = run_log_path(self.run)
        while True:
            try:
                chunk = await asyncio.to_thread(log_read, path, offset)
            except OSError as exc:  # unreadable (permissions, a vanished disk): say so, stop
                logger.warning("run %s: its log cannot be read: %s", self.run.pk, exc)
                await self.send_json({"type": "error", "message": "the run's log cannot be read"})
                return
            if chunk is not None:
                offset = chunk.end
                await self.send_json(chunk.as_message())
            await asyncio.sleep(LOG_POLL_S)

    async def disconnect(self, code: int) -> None:
        if self.log_task is not None:
            self.log_task.cancel()
        if self.session_group is not None:
            await self.channel_layer.group_discard(self.session_group, self.channel_name)
        if self.access_group is not None:
            await self.channel_layer.group_discard(self.access_group, self.channel_name)
        if self.run is not None:
            await self.channel_layer.group_discard(run_group_name(self.run.pk), self.channel_name)

    async def send_backlog(self) -> None:
        """Send the score series at once, then every other series up to the same step, in chunks."""
        run_id = self.run.pk
        head = await database_sync_to_async(run_metric_series)(
            run_id=run_id, names=HEADLINE_METRICS, max_points=DEFAULT_MAX_POINTS
        )
        self.last_step = head["last_step"]
        if self.last_step is None:
            await self._send_backlog(head["series"], downsampled=False, complete=True)
            return
        await self._send_backlog(head["series"], downsampled=head["downsampled"], complete=False)
        rest = await database_sync_to_async(run_metric_series)(
            run_id=run_id, step_max=self.last_step, max_points=DEFAULT_MAX_POINTS
        )
        others = {k: v for k, v in rest["series"].items() if k not in head["series"]}
        chunks = chunk_series(others, BACKLOG_POINTS_PER_MESSAGE) or [{}]
        for i, series in enumerate(chunks):
            complete = i == len(chunks) - 1
            await self._send_backlog(series, downsampled=rest["downsampled"], complete=complete)

    async def _send_backlog(self, series: dict, *, downsampled: bool, complete: bool) -> None:
        self.known_names.update(series)
        message = {
            "type": "backlog",
            "run": run_state(self.run),
            "progress": self._progress(),
            "panels": metric_panels(series),
            "series": series,
            "last_step": self.last_step,
            "downsampled": downsampled,
            "complete": complete,
        }
        if complete:  # the alerts stored so far: the page may predate some
            message["health"] = await database_sync_to_async(health_alerts_of_run)(
                run_id=self.run.pk
            )
        await self.send_json(message)

    async def send_since(self, since: int) -> None:
        """Send every step after ``since`` (a reconnecting client's last step), in chunks."""
        points = await database_sync_to_async(run_metric_points_since)(
            run_id=self.run.pk, since_step=since
        )
        # The client now holds every step up to the newest it was sent or said it had.
        held = [since] + ([self.last_step] if self.last_step is not None else [])
        self.last_step = max(held + [point["step"] for point in points[-1:]])
        for start in range(0, max(len(points), 1), SINCE_POINTS_PER_MESSAGE):
            await self._send_points(points[start : start + SINCE_POINTS_PER_MESSAGE])

    async def _send_points(self, points: list[dict[str, Any]]) -> None:
        message: dict[str, Any] = {"type": "metrics", "points": points}
        new = {name for point in points for name in point["metrics"]} - self.known_names
        if new:
            self.known_names.update(new)
            message["panels"] = metric_panels(new)
        if points:
            self.run.latest_step = max(self.run.latest_step, points[-1]["step"])
        message["progress"] = self._progress()
        message["run"] = run_state(self.run)
        await self.send_json(message)

    def _progress(self) -> dict[str, Any]:
        return run_progress_of(self.run).as_dict()

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict) or "since_step" not in content:
            await self.send_json(
                {"type": "error", "message": 'unknown request; send {"since_step": <last step>}'}
            )
            return
        try:
            since = _since(content["since_step"])
        except ValueError as exc:
            await self.send_json({"type": "error", "message": str(exc)})
            return
        await self.send_since(since)

    async def run_event(self, event: dict[str, Any]) -> None:
        """Forward one ``run.event`` of the group (see ``webapp.runs.events``)."""
        if self.run is None:  # closed for a right taken away; the close is on its way
            return
        kind = event.get("event")
        if kind == "metrics":
            step = int(event["step"])
            sent = -1 if self.last_step is None else self.last_step
            if step <= sent:
                return
            if step > sent + 1:
                # Events went missing (a slow socket's full channel, a Redis hiccup): read the
                # gap, this step included, from PostgreSQL, where the step landed before its event.
                await self.send_since(sent)
                if self.last_step is not None and step <= self.last_step:
                    return
            self.last_step = step
            wall_time = datetime.fromisoformat(event["wall_time"])
            time = epoch_seconds(wall_time)
            # The step's write beat the heartbeat and ended a stall (driver_writes.run_record_step).
            self.run.heartbeat_at = max(self.run.heartbeat_at or wall_time, wall_time)
            self.run.stalled_since = None
            if event.get("checkpoint"):
                self.run.latest_checkpoint = event["checkpoint"]
            await self._send_points([{"step": step, "time": time, "metrics": event["metrics"]}])
        elif kind in ("status", "heartbeat"):
            fresh = await database_sync_to_async(run_for_owner)(
                user=self.scope["user"], run_id=self.run.pk
            )
            if fresh is None:  # deleted (or handed over) while the page was open
                await self.close(code=CLOSE_FORBIDDEN)
                return
            self.run = fresh
            if self.last_step is not None and fresh.latest_step > self.last_step:
                await self.send_since(self.last_step)  # steps whose events went missing
            await self.send_json(
                {"type": "status", "run": run_state(fresh), "progress": self._progress()}
            )
        elif kind == "samples":
            fields = ("step", "split", "count", "reward_mean")
            await self.send_json({"type": "samples", **{k: event.get(k) for k in fields}})
        elif kind == "health":
            await self.send_json({"type": "health", "alerts": [event["alert"]]})
        elif kind == "checkpoints":  # a checkpoint job changed: the page reads its list again
            await self.send_json({"type": "checkpoints"})

    async def access_changed(self, event: dict[str, Any]) -> None:
        """Check the user's right to the run again: closed with 4403 once it is gone.

        Sent to the user's group and the run's (``webapp.projects.access.access_changed``) when
        a right was taken away: a member removed, an experiment moved out, a share revoked.
        """
        if self.run is None:
            return
        still = await database_sync_to_async(run_for_owner)(
            user=self.scope["user"], run_id=self.run.pk
        )
        if still is None:  # stop every stream first: nothing more goes out
            if self.log_task is not None:
                self.log_task.cancel()
            await self.channel_layer.group_discard(run_group_name(self.run.pk), self.channel_name)
            self.run = None
            await self.close(code=CLOSE_FORBIDDEN)

    async def session_ended(self, event: dict[str, Any]) -> None:
        """Close the socket: its session ended (logged out, deleted or expired and cleared)."""
        if not self.closed_for_session:  # a log-out also deletes the session: two messages
            self.closed_for_session = True
            await self.close(code=CLOSE_UNAUTHENTICATED)
