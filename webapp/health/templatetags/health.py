"""``{% run_health run %}`` (the run page's alert list), ``{% health_badges run %}`` (a list row's)
and ``{% with_health_alerts runs as runs %}`` (one query for a list's badges)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django import template
from django.db.models import prefetch_related_objects

register = template.Library()


@register.inclusion_tag("runs/_health.html")
def run_health(run: Any) -> dict[str, Any]:
    """Render the run page's health alerts; its script adds the ones that fire while open."""
    return {"run": run, "alerts": list(run.health_alerts.all())}


@register.inclusion_tag("health/_badges.html")
def health_badges(run: Any) -> dict[str, Any]:
    """Render a run's alerts as small badges (prefetch ``health_alerts`` for a list of runs)."""
    return {"alerts": list(run.health_alerts.all())}


@register.simple_tag
def with_health_alerts(items: Iterable[Any]) -> list[Any]:
    """Return ``items`` as a list, their runs' alerts fetched in one query (``{% ... as runs %}``).

    An item is a run, or a row with a ``run`` (alone or first of a tuple, as the runs table's).
    """
    items = list(items)
    prefetch_related_objects([_run_of(item) for item in items], "health_alerts")
    return items


def _run_of(item: Any) -> Any:
    row = item[0] if isinstance(item, tuple) else item
    return getattr(row, "run", row)
