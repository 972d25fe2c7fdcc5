"""The API's rate setting, ``POSTTRAIN_API_RATE = "600/min"``: requests per window.

Only the standard library: the settings module checks the value with ``parse_rate`` when it
loads, before Django is set up.
"""

from __future__ import annotations

import re
from typing import NamedTuple

PERIODS = {"s": 1, "sec": 1, "second": 1, "min": 60, "minute": 60, "h": 3600, "hour": 3600}
PERIODS |= {"d": 86400, "day": 86400}
PERIOD_NAMES = {1: "second", 60: "minute", 3600: "hour", 86400: "day"}
_RATE = re.compile(r"\s*(\d+)\s*/\s*([a-z]+)\s*")


class Rate(NamedTuple):
    """At most ``requests`` in each window of ``seconds``."""

    requests: int
    seconds: int

    def __str__(self) -> str:
        return f"{self.requests} requests per {PERIOD_NAMES[self.seconds]}"


def parse_rate(text: str) -> Rate:
    """Return the rate of ``"600/min"`` (per s, sec, second, min, minute, h, hour, d or day).

    Raise ``ValueError`` saying how to write it.
    """
    match = _RATE.fullmatch(text.lower())
    if match is None or match.group(2) not in PERIODS or int(match.group(1)) < 1:
        raise ValueError(
            f"{text!r} is not a rate; write requests/period with at least 1 request and a period "
            "of s, min, hour or day, e.g. 600/min"
        )
    return Rate(int(match.group(1)), PERIODS[match.group(2)])
