"""``{% run_health run %}`` (the run page's alert list) and ``{% health_badges run %}`` (a list row's)."""

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
def with_health_alerts(runs: Iterable[Any]) -> list[Any]:
    """Return ``runs`` as a list with their alerts fetched in one query (``{% ... as runs %}``)."""
    runs = list(runs)
    prefetch_related_objects(runs, "health_alerts")
    return runs
