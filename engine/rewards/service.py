"""JSON over HTTP to an allowed reward service: timeouts, retries with back-off, a bound on the
requests in flight and a per-run request rate.

:class:`ServiceClient` is what the remote reward manager (``engine.rewards.remote``) and the
SandboxFusion code runner (``engine.rewards.sandbox_fusion``) post through. The guarantees:

- **Only the allowed address.** The client is built from an :class:`~engine.rewards.endpoints.
  Endpoint` (the administrator's list) and follows no redirect, so an allowed service cannot
  send the run's responses on to another address.
- **Timeouts.** Each try gets ``timeout`` seconds to connect and answer, its whole answer read
  (one byte at a time does not keep it alive); a slower service is a timed-out try. An answer
  over :data:`MAX_ANSWER_BYTES` is a bad answer.
- **Retries with back-off.** A try that fails on the way (connection refused or reset, a
  timeout, HTTP 429 or 5xx) is tried again up to ``max_retries`` times, after ``backoff_s``,
  then twice that, and so on (at most :data:`MAX_BACKOFF_S`; a 429's ``Retry-After`` is obeyed
  up to that too). An answer that arrives but is wrong (another 4xx, a body that is not JSON) is
  not retried: the service gave its answer.
- **Backpressure.** :meth:`ServiceClient.map` keeps at most ``max_concurrent`` requests in flight
  and starts the next one when one finishes, so a big batch queues here instead of swamping the
  service.
- **Rate limit.** With ``max_rpm`` each try (retries too) waits for its slot in a token bucket
  of ``max_rpm`` requests a minute, bursts of at most one second's worth, as verl's
  ``RateLimitedRewardManager`` limits requests per minute. The bucket belongs to the client, so
  one run's limit is its own.

Every failure is a :class:`ServiceError` whose message starts with ``reward service '<name>'``,
so a run's error and each failed sample's ``reward_error`` say which service misbehaved.
"""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from engine.rewards.endpoints import Endpoint

# The longest pause between two tries, however many retries came before.
MAX_BACKOFF_S = 30.0
# HTTP statuses worth another try: the service is busy or briefly down.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# The largest answer read; a bigger one is a bad answer (64 MiB: far more than any batch's scores).
MAX_ANSWER_BYTES = 64 << 20
# At most this much of a bad answer is quoted in an error.
_QUOTE = 200

T = TypeVar("T")
R = TypeVar("R")


class ServiceError(RuntimeError):
    """A reward service could not be reached or answered wrongly; the message names it."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        return None  # a 3xx becomes an HTTPError: the allowed address is the only one used


class RateLimiter:
    """A thread-safe token bucket: :meth:`acquire` returns when one request may start."""

    def __init__(self, per_minute: float) -> None:
        if not (math.isfinite(per_minute) and per_minute > 0):
            raise ValueError(f"a request rate must be a finite number > 0, got {per_minute!r}")
        self.rate = per_minute / 60.0  # requests a second
        self.capacity = max(1.0, self.rate)  # a burst of one second's worth, at least one
        self.tokens = self.capacity
        self.updated = time.monotonic()
        self.lock = threading.Lock()

    def acquire(self) -> None:
        """Take one request's token, sleeping until the bucket has one."""
        while True:
            with self.lock:
                now = time.monotonic()
                self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
                self.updated = now
                if self.tokens >= 1.0:
                    self.tokens -= 1.0
                    return
                pause = (1.0 - self.tokens) / self.rate
            time.sleep(pause)


class ServiceClient:
    """Post JSON to one allowed endpoint under the module's timeout, retry and rate rules."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        timeout: float = 30.0,
        max_retries: int = 2,
        backoff_s: float = 0.5,
        max_concurrent: int = 4,
        max_rpm: float | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.max_concurrent = int(max_concurrent)
        self.limiter = RateLimiter(max_rpm) if max_rpm else None
        self._opener = urllib.request.build_opener(_NoRedirect)
        self.requests = 0  # tries sent, retries included
        self.retries = 0
        self._count = threading.Lock()

    def error(self, message: str) -> ServiceError:
        """Return a ServiceError naming this service."""
        return ServiceError(f"reward service {self.endpoint.name!r} {message}")

    def post(self, payload: Any) -> Any:
        """Return the service's JSON answer to ``payload``; raise ServiceError past the retries."""
        body = json.dumps(payload, default=_plain, allow_nan=False).encode()
        failure = "was not tried"
        for attempt in range(self.max_retries + 1):
            if attempt:
                with self._count:
                    self.retries += 1
            if self.limiter is not None:
                self.limiter.acquire()
            with self._count:
                self.requests += 1
            retry_after = None
            try:
                answer = self._try(body)
            except urllib.error.HTTPError as exc:
                detail = _quote(exc.read())
                failure = f"answered HTTP {exc.code} {exc.reason}: {detail}"
                if exc.code not in RETRY_STATUSES:
                    raise self.error(failure) from None
                retry_after = _seconds(exc.headers.get("Retry-After"))
            except TimeoutError:
                failure = f"did not answer within the {self.timeout:g} s timeout"
            except (urllib.error.URLError, ConnectionError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                failure = (
                    f"did not answer within the {self.timeout:g} s timeout"
                    if isinstance(reason, TimeoutError)
                    else f"could not be reached: {reason}"
                )
            else:
                return self._parse(answer)
            if attempt < self.max_retries:
                pause = min(MAX_BACKOFF_S, self.backoff_s * 2**attempt)
                time.sleep(min(MAX_BACKOFF_S, max(pause, retry_after or 0.0)))
        tries = self.max_retries + 1
        raise self.error(f"{failure} (after {tries} {'try' if tries == 1 else 'tries'})")

    def _try(self, body: bytes) -> bytes:
        """Return one try's answer, read whole within ``timeout`` and at most
        :data:`MAX_ANSWER_BYTES` (a service trickling bytes is as slow as a silent one)."""
        deadline = time.monotonic() + self.timeout
        request = urllib.request.Request(
            self.endpoint.url,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        chunks, size = [], 0
        with self._opener.open(request, timeout=self.timeout) as response:
            while chunk := response.read1(1 << 16):
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    raise self.error(f"answered more than {MAX_ANSWER_BYTES} bytes")
                if time.monotonic() > deadline:
                    raise TimeoutError
                chunks.append(chunk)
        return b"".join(chunks)

    def _parse(self, answer: bytes) -> Any:
        try:
            return json.loads(answer, parse_constant=_refuse_constant)
        except ValueError as exc:
            raise self.error(
                f"answered with a body that is not JSON ({exc}): {_quote(answer)}"
            ) from None

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """Return ``fn(item)`` for each item, at most ``max_concurrent`` calls at once, in order."""
        if len(items) <= 1 or self.max_concurrent == 1:
            return [fn(item) for item in items]
        with ThreadPoolExecutor(min(self.max_concurrent, len(items))) as pool:
            return list(pool.map(fn, items))


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def _plain(value: Any) -> Any:
    """Return a numpy value or array as plain JSON data, anything else as its text."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def _quote(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace").strip()
    return repr(text if len(text) <= _QUOTE else text[: _QUOTE - 3] + "...")


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
