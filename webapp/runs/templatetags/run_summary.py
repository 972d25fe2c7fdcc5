"""``{% summary_metrics as names %}``: the metric names the run page lists first, for its script."""

from __future__ import annotations

from django import template

from webapp.runs.selectors import SUMMARY_METRICS

register = template.Library()


@register.simple_tag
def summary_metrics() -> list[str]:
    """Return ``SUMMARY_METRICS`` (the live latest-metrics table keeps the server's order)."""
    return list(SUMMARY_METRICS)
