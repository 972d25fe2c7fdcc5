"""Reads of a run's health alerts."""

from __future__ import annotations

from typing import Any

from webapp.health.models import HealthAlert


def health_alerts_of_run(*, run_id: int) -> list[dict[str, Any]]:
    """Return the run's alerts as the run page's script reads them, in the order they fired."""
    return [alert.as_event() for alert in HealthAlert.objects.filter(run_id=run_id)]
