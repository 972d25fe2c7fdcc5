"""How a metric's value reads wherever the studio shows one: tables, the run page, sweeps.

A fixed number of decimals hides what matters in RL metrics: a learning rate of ``1e-6`` or a
KL of ``3e-5`` reads as ``0.0000``. :func:`metric_text` keeps four significant digits in
plain form from ``0.001`` up, writes whole numbers whole, and switches to an exponent with three
significant digits for smaller (and very large) magnitudes: ``0.8125``, ``12.35``, ``1235``,
``1e-6``, ``2.35e-5``. ``frontend/js/numbers.js`` is the same function for the live updates;
both round half away from zero on the exact binary value, as JavaScript's ``toFixed`` does, so
a page's first paint and its live updates print the same text.
"""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

PLAIN_MIN = 1e-3  # smaller magnitudes are written with an exponent
PLAIN_MAX = 1e15  # so are larger ones (whole numbers below it are written whole)
# Decimals of a plain number by its magnitude: four significant digits (more when its whole part
# is longer). Compared with written-out powers of ten, not through log10 or pow, so Python and
# JavaScript pick the same count for every double.
DECIMALS = ((1000, 0), (100, 1), (10, 2), (1, 3), (0.1, 4), (0.01, 5), (PLAIN_MIN, 6))
EXPONENT_DIGITS = 3  # significant digits of a number written with an exponent


def _strip(text: str) -> str:
    return text.rstrip("0").rstrip(".") if "." in text else text


def _exponent_text(number: float) -> str:
    exact = Decimal(number)
    exponent = exact.adjusted()
    mantissa = (exact.scaleb(-exponent)).quantize(
        Decimal(1).scaleb(1 - EXPONENT_DIGITS), rounding=ROUND_HALF_UP
    )
    if abs(mantissa) >= 10:  # 9.995e-6 rounds up to 10.0e-6: 1e-5
        mantissa, exponent = mantissa / 10, exponent + 1
    return f"{_strip(format(mantissa, 'f'))}e{exponent}"


def metric_text(value: Any) -> str:
    """Return a metric's value as the studio prints it; ``—`` for None, NaN and infinities.

    Non-numbers (a string a tracker logged) are returned as their text.
    """
    if value is None:
        return "—"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    number = float(value)
    if not math.isfinite(number):
        return "—"
    magnitude = abs(number)
    if number.is_integer() and magnitude < PLAIN_MAX:
        return str(int(number))
    if magnitude < PLAIN_MIN or magnitude >= PLAIN_MAX:
        return _exponent_text(number)
    decimals = next(d for floor, d in DECIMALS if magnitude >= floor)
    exact = Decimal(number).quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP)
    return _strip(format(exact, "f"))
