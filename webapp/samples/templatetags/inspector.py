"""Number formatting for the inspector: four significant digits, a dash for missing or NaN."""

from __future__ import annotations

import json
import math
from typing import Any

from django import template

register = template.Library()


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


@register.filter
def num(value: Any) -> str:
    """Format a number with four significant digits; '—' for None or a non-finite value."""
    number = _number(value)
    if number is None:
        return "—" if value is None or isinstance(value, int | float) else str(value)
    return f"{number:.4g}"


@register.filter
def signed(value: Any) -> str:
    """Format a difference with its sign (+0.25, -1); '—' when missing."""
    number = _number(value)
    return "—" if number is None else f"{number:+.4g}"


@register.filter
def json_text(value: Any) -> str:
    """Return ``value`` as compact JSON text (a tool call's arguments), escaped by the template."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True)
