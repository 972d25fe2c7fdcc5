"""``{{ value|metric }}``: a metric's value as every page prints it (``webapp.runs.numbers``)."""

from __future__ import annotations

from typing import Any

from django import template

from webapp.runs.numbers import metric_text

register = template.Library()


@register.filter
def metric(value: Any) -> str:
    """Return ``value`` with four significant digits, or an exponent when small (``1e-6``)."""
    return metric_text(value)
