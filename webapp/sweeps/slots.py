"""A sweep's concurrency limit, applied where a queued run is claimed for a driver.

``webapp.runs.driver_writes.run_claim_for_start`` asks :func:`sweep_member_may_start` inside its
transaction, so the limit is held by the same claim as ``POSTTRAIN_MAX_RUNNING_RUNS``: a member
over its sweep's limit stays queued and the ``dispatch_queued_runs`` sweep starts it when an
earlier member ends. No second scheduler.
"""

from __future__ import annotations

from webapp.runs.models import DRIVER_STATUSES, Run
from webapp.sweeps.models import Sweep, SweepMember


def sweep_member_may_start(*, run_id: int) -> bool:
    """Return whether run ``run_id`` may get a driver now as far as its sweep goes.

    True for a run of no sweep. A member may start while fewer than the sweep's ``concurrency``
    members have a driver, and never once the sweep is cancelled. Call it inside the claim's
    transaction: it locks the sweep's row, so two members' claims count one after the other.
    """
    sweep_id = SweepMember.objects.filter(run_id=run_id).values_list("sweep_id", flat=True).first()
    if sweep_id is None:
        return True
    sweep = Sweep.objects.select_for_update().get(pk=sweep_id)
    if sweep.cancelled_at is not None:
        return False
    busy = Run.objects.filter(sweep_member__sweep_id=sweep_id, status__in=DRIVER_STATUSES).count()
    return busy < sweep.concurrency
