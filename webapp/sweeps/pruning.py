"""Early stopping of a sweep's members: the pruner judges each step that records the objective.

``webapp.runs.driver_writes.run_record_step`` calls :func:`sweep_prune_on_step` with every step a
driver records, in the step's transaction, so the decision sees the step. A member whose
objective metric falls behind by the sweep's pruner (``webapp.sweeps.search.prune_decision``,
Optuna's median or successive-halving pruner over the members' recorded values) gets the reason
on its ``SweepMember.pruned`` (metric, step, value, the threshold it failed, the pruner) and its
run is asked to stop after the step (``cancel_requested``): the driver ends it cancelled, its
checkpoints kept, and the sweep's slot goes to the next member. A member is pruned once.

Failure policy: a failing decision is logged and the step is recorded anyway (the member goes
on); the next step that records the metric is judged again.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from django.db import transaction
from django.utils import timezone

from webapp.runs.events import publish_run_event, status_event
from webapp.runs.models import ACTIVE_STATUSES, Run, ask_drivers_to_stop
from webapp.sweeps.models import SweepMember
from webapp.sweeps.selectors import member_histories
from webapp.sweeps.trials import RUNNING, MemberHistory

logger = logging.getLogger(__name__)


def sweep_prune_check(
    *, run_id: int, step: int, metrics: Mapping[str, Any]
) -> dict[str, Any] | None:
    """Stop the run when its sweep's pruner says its objective metric fell behind at ``step``.

    Return the recorded reason (``SweepMember.pruned``) or None. Only a member of a sweep with a
    pruner whose step recorded its objective metric is judged, once: the run is asked to stop
    after the step (``cancel_requested``: it ends cancelled, its checkpoints kept).
    """
    member = (
        SweepMember.objects.filter(
            run_id=run_id, pruned__isnull=True, sweep__spec__has_key="pruner"
        )
        .select_related("sweep")
        .first()
    )
    if member is None:
        return None
    spec = member.sweep.spec
    value = metrics.get(spec["objective"]["metric"])
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    histories = member_histories(sweep=member.sweep)
    current = next(h for h in histories if h.index == member.index)
    if current.state != RUNNING:
        return None
    scores = {s: v for s, v in current.scores.items() if s < step} | {step: float(value)}
    histories = [
        MemberHistory(index=h.index, values=h.values, state=RUNNING, scores=scores)
        if h.index == member.index
        else h
        for h in histories
    ]
    from webapp.sweeps.search import prune_decision  # Optuna, only where a pruner judges

    decision = prune_decision(spec, histories, member.index)
    if decision is None:
        return None
    reason = {**decision.as_dict(), "at": timezone.now().isoformat()}
    if not SweepMember.objects.filter(pk=member.pk, pruned__isnull=True).update(pruned=reason):
        return None
    ask_drivers_to_stop(Run.objects.filter(pk=run_id, status__in=ACTIVE_STATUSES), timezone.now())
    transaction.on_commit(lambda: _publish_status(run_id))
    logger.info("run %s pruned by sweep %s: %s", run_id, member.sweep_id, decision.text())
    return reason


def sweep_prune_on_step(*, run_id: int, step: int, metrics: Mapping[str, Any]) -> None:
    """Run :func:`sweep_prune_check`; log (never raise) a failure: the step is recorded anyway."""
    try:
        with transaction.atomic():
            sweep_prune_check(run_id=run_id, step=step, metrics=metrics)
    except Exception:
        logger.exception("run %s: the sweep's pruner failed at step %s", run_id, step)


def _publish_status(run_id: int) -> None:
    run = Run.objects.filter(pk=run_id).first()
    if run is not None:
        publish_run_event(status_event(run))
