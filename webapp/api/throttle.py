"""The API's rate limit: ``POSTTRAIN_API_RATE`` requests per window for each token, and for each
user's browser session, so a leaked token or a client stuck in a loop cannot hammer the server.

Fixed windows aligned to the clock, counted in Redis (the ``api_rate`` cache, shared by every
web process): a request adds one to its window's counter with an atomic ``INCR`` and is refused
once the counter passes the limit, with 429, ``Retry-After`` (the seconds left in the window)
and the API's error shape. A fixed window lets a client send up to twice the limit across a
window's end; a sliding window would need a sorted set per client for little gain here.

Tokens are told apart by their digest, not their owner: two tokens of one user, or a token and
the user's session, have separate counters. If Redis cannot be reached the request is let
through (a warning is logged, at most once a minute): the limit guards the server, it should
not take the API down with it.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import caches
from django.http import HttpRequest
from ninja.throttling import BaseThrottle
from redis.exceptions import RedisError

from webapp.api.rates import Rate, parse_rate

logger = logging.getLogger(__name__)

CACHE = "api_rate"
_now = time.time  # the tests move the clock
_warned_at = -math.inf


@dataclass(frozen=True)
class RateRefusal:
    """Why a request was refused: the limit, whose it is and when the window ends."""

    rate: Rate
    holder: str  # "token" or "session"
    retry_after: int  # whole seconds

    @property
    def message(self) -> str:
        who = "this token" if self.holder == "token" else "your session"
        return (
            f"too many requests: {who} may send {self.rate}; wait {self.retry_after} s "
            "(Retry-After) and space the requests out"
        )


def _client_key(request: HttpRequest) -> tuple[str, str]:
    """Return (holder, counter key) of the request's token, or of its user's session."""
    digest = getattr(request, "api_token_digest", None)
    if digest:
        return "token", f"token:{digest[:32]}"
    return "session", f"user:{request.user.pk}"


def _warn_unavailable(exc: Exception) -> None:
    global _warned_at
    if _now() - _warned_at >= 60:
        _warned_at = _now()
        logger.warning("API rate limit not applied: Redis cannot be reached (%s)", exc)


class ApiRateThrottle(BaseThrottle):
    """Count the request against its token's (or session's) window; refuse it past the limit.

    A refused request gets ``request.api_rate_refusal`` (a ``RateRefusal``), which the API's
    handler of ``Throttled`` turns into the 429 answer; nothing is kept on the instance, which
    every request shares.
    """

    def allow_request(self, request: HttpRequest) -> bool:
        rate = parse_rate(settings.POSTTRAIN_API_RATE)
        holder, client = _client_key(request)
        now = _now()
        window = int(now // rate.seconds)
        key = f"api-rate:{client}:{rate.seconds}:{window}"
        cache = caches[CACHE]
        try:
            cache.add(key, 0, timeout=rate.seconds + 1)
            used = cache.incr(key)
        except (RedisError, OSError) as exc:
            _warn_unavailable(exc)
            return True
        except ValueError:  # the counter vanished between add and incr (a flushed Redis)
            return True
        if used <= rate.requests:
            return True
        retry_after = max(1, math.ceil((window + 1) * rate.seconds - now))
        request.api_rate_refusal = RateRefusal(rate, holder, retry_after)  # type: ignore[attr-defined]
        return False
