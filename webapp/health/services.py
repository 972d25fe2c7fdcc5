"""Run the health checks on each recorded step; store and publish the alerts that fire.

``webapp.runs.driver_writes.run_record_step`` calls :func:`health_record_step` inside the step's
transaction, so an alert lands with the step it fired at (and a retried step, rolled back,
fires again or not at all with it). The checks' state is one row per run, read and rewritten
once per step: no step's history is re-read.

Failure policy: a check that raises (a bug, an odd metric) is logged and the step is recorded
without it; its work is undone by a savepoint, so the step's own transaction goes on.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.db import transaction

from webapp.alerts.services import alerts_on_health
from webapp.health.checks import HealthState, RunContext, Thresholds, evaluate_step
from webapp.health.models import HealthAlert, RunHealthState
from webapp.runs.events import publish_run_event, run_event
from webapp.runs.models import Run

logger = logging.getLogger(__name__)


def health_thresholds() -> Thresholds:
    """Return the thresholds of the ``POSTTRAIN_HEALTH_*`` settings."""
    return Thresholds(
        **{
            f.name: getattr(settings, f"POSTTRAIN_HEALTH_{f.name.upper()}")
            for f in dataclasses.fields(Thresholds)
        }
    )


def health_event(alert: HealthAlert) -> dict[str, Any]:
    """Return the ``health`` message of the run's channel group for one alert."""
    return run_event(alert.run_id, "health", alert=alert.as_event())


def _state_for_update(run_id: int) -> RunHealthState:
    row = RunHealthState.objects.select_for_update().filter(run_id=run_id).first()
    if row is not None:
        return row
    config, total_steps = Run.objects.values_list("config", "total_steps").get(pk=run_id)
    context = dataclasses.asdict(RunContext.from_config(config or {}, total_steps))
    row, _ = RunHealthState.objects.get_or_create(
        run_id=run_id, defaults={"context": context, "state": HealthState().to_dict()}
    )
    return row


def health_evaluate_step(
    *, run_id: int, step: int, metrics: Mapping[str, Any]
) -> list[HealthAlert]:
    """Run the checks on one step; store the alerts that fire and publish each on commit."""
    row = _state_for_update(run_id)
    state = HealthState.from_dict(row.state)
    findings = evaluate_step(
        state,
        step,
        metrics,
        context=RunContext(**row.context),
        thresholds=health_thresholds(),
    )
    row.state = state.to_dict()
    row.save(update_fields=["state"])
    alerts = []
    for finding in findings:
        alert, created = HealthAlert.objects.get_or_create(
            run_id=run_id,
            check_name=finding.check,
            defaults={"step": finding.step, "message": finding.message[:500]},
        )
        if created:
            alerts.append(alert)
            transaction.on_commit(lambda alert=alert: publish_run_event(health_event(alert)))
            alerts_on_health(
                run_id=run_id,
                check=alert.check_name,
                label=alert.label,
                step=alert.step,
                message=alert.message,
            )
    return alerts


def health_record_step(*, run_id: int, step: int, metrics: Mapping[str, Any]) -> list[HealthAlert]:
    """Run :func:`health_evaluate_step`; log (never raise) a failure and return no alerts."""
    try:
        with transaction.atomic():
            return health_evaluate_step(run_id=run_id, step=step, metrics=metrics)
    except Exception:
        logger.exception("run %s: the health checks failed at step %s", run_id, step)
        return []
