"""Report a run the studio did not launch: ``ExternalRun`` speaks ``/api/external-runs``.

``posttrain watch`` (verl's files), the TRL callback (``posttrain_client.trl``) and the engine's
``posttrain`` logger all report through it:

    run = ExternalRun.create(studio, key=new_key(), name="qwen-grpo", source="verl")
    run.steps([(1, {"critic/score/mean": 0.4})])
    run.samples([{"step": 1, "prompt": "...", "response": "...", "reward": 1.0,
                  "sample_index": 0}])
    run.log_lines(["step 1 done"])
    run.heartbeat()          # the answer says whether the owner asked to cancel
    run.finish("succeeded")

Failure policy: every call is idempotent on the server, so a call whose answer did not come is
sent again. A studio that cannot be reached, answers 5xx (it restarts) or 429 (the rate limit:
its ``Retry-After`` is slept) is retried with a back-off capped at ``BACKOFF_MAX_S`` for up to
``retry_for_s`` seconds (None: for ever), logging once when it starts failing and once when it
answers again; past that the call raises ``StudioUnreachable``. Any other refusal (a revoked
token, a size limit, an ended run) raises ``StudioError`` at once: sending it again would not
help. Batches are cut to the server's limits (samples by count and by bytes of JSON), so the
caller hands over whole steps.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import httpx

from posttrain_client.client import Studio, StudioError

logger = logging.getLogger("posttrain_client")

try:  # verl writes its file log with orjson, so a verl machine has it: 5-10x json's speed
    import orjson

    def _encode(value: Any) -> bytes:
        return orjson.dumps(value)

except ImportError:  # pragma: no cover - exercised where orjson is missing

    def _encode(value: Any) -> bytes:
        return json.dumps(value, ensure_ascii=False).encode()


MAX_SAMPLES_PER_REQUEST = 2000
MAX_BODY_BYTES = 8 * 1024**2
MAX_STEPS_PER_REQUEST = 500
MAX_LOG_LINES_PER_REQUEST = 2000
MAX_LOG_LINE_CHARS = 16_384
BACKOFF_MAX_S = 30.0
RETRY_STATUSES = (429, 500, 502, 503, 504)


class StudioUnreachable(RuntimeError):
    """The studio did not answer (or answered 5xx / 429) for longer than the caller allows."""


def new_key() -> str:
    """Return a fresh run key: the client keeps it, so a retried create finds its run."""
    return secrets.token_urlsafe(24)


def jsonable(value: Any) -> Any:
    """Return ``value`` as strict JSON takes it: NaN and inf as null, tuples as lists, numpy
    scalars and arrays as numbers and lists, any other object as its text."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist"):  # numpy / torch scalars and arrays
        return jsonable(value.tolist())
    if value is None or isinstance(value, str | int | bool):
        return value
    return str(value)  # an enum, a path, a dtype: shown as its text


def _body(items: Sequence[bytes], name: str) -> bytes:
    return b'{"' + name.encode() + b'":[' + b",".join(items) + b"]}"


def batches(
    items: Iterable[bytes], *, max_items: int, max_bytes: int = MAX_BODY_BYTES
) -> Iterable[list[bytes]]:
    """Yield the encoded ``items`` in lists of at most ``max_items`` and about ``max_bytes``."""
    batch: list[bytes] = []
    size = 0
    for item in items:
        if batch and (len(batch) >= max_items or size + len(item) + 1 > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += len(item) + 1
    if batch:
        yield batch


class ExternalRun:
    """One external run in a studio, as its reporter sees it (``data``: the server's answer)."""

    def __init__(self, studio: Studio, data: dict[str, Any], *, retry_for_s: float | None) -> None:
        self.studio = studio
        self.data = data
        self.retry_for_s = retry_for_s
        self.log_offset = int(data.get("log_lines", 0))
        self._failing_since: float | None = None

    @property
    def id(self) -> int:
        return self.data["id"]

    @property
    def url(self) -> str:
        return str(self.studio.http.base_url).rstrip("/").removesuffix("/api") + self.data["url"]

    @classmethod
    def create(
        cls,
        studio: Studio,
        *,
        key: str,
        name: str,
        source: str,
        retry_for_s: float | None = None,
        **fields: Any,
    ) -> ExternalRun:
        """Create the run, or find the one ``key`` made (``fields``: location, client,
        cancel_honoured, config, config_yaml, total_steps, tags)."""
        body = jsonable({"key": key, "name": name, "source": source, **fields})
        run = cls(studio, {}, retry_for_s=retry_for_s)
        run.data = run._call("POST", "/external-runs", json=body)
        run.log_offset = int(run.data.get("log_lines", 0))
        return run

    # -- the calls -------------------------------------------------------------------------
    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        """Send one request, retrying what a restarting or busy studio answers."""
        delay = 0.5
        started = time.monotonic()
        while True:
            try:
                answer = self.studio.json(method, path, **kwargs)
            except (httpx.TransportError, StudioError) as exc:
                status = getattr(exc, "status", None)
                if isinstance(exc, StudioError) and status not in RETRY_STATUSES:
                    raise
                waited = time.monotonic() - started
                if self.retry_for_s is not None and waited >= self.retry_for_s:
                    raise StudioUnreachable(
                        f"the studio did not take {method} {path} for {waited:.0f} s ({exc})"
                    ) from exc
                if self._failing_since is None:
                    self._failing_since = time.monotonic()
                    logger.warning("posttrain: the studio does not answer (%s); retrying", exc)
                retry_after = getattr(exc, "retry_after", None)
                time.sleep(retry_after if retry_after else delay)
                delay = min(delay * 2, BACKOFF_MAX_S)
                continue
            if self._failing_since is not None:
                logger.warning(
                    "posttrain: the studio answers again after %.0f s",
                    time.monotonic() - self._failing_since,
                )
                self._failing_since = None
            return answer

    def _post_raw(self, path: str, body: bytes) -> Any:
        headers = {"Content-Type": "application/json"}
        return self._call("POST", path, content=body, headers=headers)

    def refresh(self) -> dict[str, Any]:
        """Read what the studio holds of the run (status, ``log_lines``...)."""
        self.data = self._call("GET", f"/external-runs/{self.id}")
        return self.data

    def attach_config(
        self, config: dict[str, Any] | None = None, *, yaml: str | None = None
    ) -> None:
        """Attach the trainer's config (a dict, or YAML text): shown and compared, never run."""
        body = {"config_yaml": yaml} if yaml is not None else {"config": jsonable(config)}
        self.data = self._call("PUT", f"/external-runs/{self.id}/config", json=body)

    def steps(
        self, steps: Iterable[tuple[int, dict[str, Any]] | tuple[int, dict[str, Any], str]]
    ) -> int:
        """Send steps as ``(step, metrics[, wall_time ISO])``; return how many were stored.

        Metric values must be numbers (numpy scalars too) or None.
        """
        encoded = []
        for item in steps:
            step, metrics = item[0], item[1]
            # NaN and inf go out as JSON's extensions: the studio stores them as null and its
            # health checks see a loss that went non-finite.
            values = {str(k): None if v is None else float(v) for k, v in metrics.items()}
            entry: dict[str, Any] = {"step": step, "metrics": values}
            if len(item) > 2:
                entry["wall_time"] = item[2]  # type: ignore[misc]
            encoded.append(json.dumps(entry).encode())
        stored = 0
        for batch in batches(encoded, max_items=MAX_STEPS_PER_REQUEST):
            stored += self._post_raw(f"/external-runs/{self.id}/steps", _body(batch, "steps"))[
                "stored"
            ]
        return stored

    def samples(self, samples: Iterable[dict[str, Any]]) -> int:
        """Send samples (the API's fields), cut into batches the server takes; return the count."""
        encoded = (_encode(jsonable(s)) for s in samples)
        stored = 0
        for batch in batches(encoded, max_items=MAX_SAMPLES_PER_REQUEST):
            body = _body(batch, "samples")
            stored += self._post_raw(f"/external-runs/{self.id}/samples", body)["stored"]
        return stored

    def delete_samples(self, step: int, split: str = "train") -> None:
        """Delete one step's samples (before sending a step again that changed)."""
        self._call(
            "DELETE", f"/external-runs/{self.id}/samples", params={"step": step, "split": split}
        )

    def log_lines(self, lines: Sequence[str]) -> None:
        """Append lines to the run's log after those the studio holds (cut to its line limit)."""
        cut = [
            line if len(line) <= MAX_LOG_LINE_CHARS else line[: MAX_LOG_LINE_CHARS - 1] + "…"
            for line in lines
        ]
        for start in range(0, len(cut), MAX_LOG_LINES_PER_REQUEST):
            chunk = cut[start : start + MAX_LOG_LINES_PER_REQUEST]
            body = {"offset": self.log_offset, "lines": chunk}
            self.log_offset = self._call("POST", f"/external-runs/{self.id}/logs", json=body)[
                "stored"
            ]

    def heartbeat(self) -> dict[str, Any]:
        """Say the run lives; return the studio's answer (``status``, ``cancel_requested``)."""
        state = self._call("POST", f"/external-runs/{self.id}/heartbeat")
        self.data.update(status=state["status"], cancel_requested=state["cancel_requested"])
        return state

    def finish(self, status: str, error: str = "") -> None:
        """End the run as succeeded, failed or cancelled."""
        body = {"status": status, "error": error[-20_000:]}
        self.data = self._call("POST", f"/external-runs/{self.id}/finish", json=body)

    @property
    def cancel_requested(self) -> bool:
        return bool(self.data.get("cancel_requested"))


class BackgroundSender:
    """Run reports in order on a thread of their own, so a training loop never waits on the studio.

    A report the studio did not take within its run's retry window is dropped (a warning); a
    refusal stops every later report (a revoked token would refuse them all).
    """

    def __init__(self) -> None:
        self.jobs: queue.Queue[Callable[[], Any] | None] = queue.Queue()
        self.broken = ""
        self.thread = threading.Thread(target=self._work, daemon=True, name="posttrain-sender")
        self.thread.start()

    def put(self, job: Callable[[], Any]) -> None:
        if not self.broken:
            self.jobs.put(job)

    def _work(self) -> None:
        while (job := self.jobs.get()) is not None:
            try:
                if not self.broken:
                    job()
            except StudioUnreachable as exc:
                logger.warning("posttrain: a report is dropped: %s", exc)
            except StudioError as exc:
                self.broken = str(exc)
                logger.warning("posttrain: the studio refused a report; reporting stops: %s", exc)
            finally:
                self.jobs.task_done()

    def close(self, timeout_s: float) -> None:
        """Send what is queued (waiting up to ``timeout_s``), then stop the thread."""
        self.jobs.put(None)
        self.thread.join(timeout_s)
