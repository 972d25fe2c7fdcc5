"""A run whose rewards keep failing is not a success: the studio stops it, and it ends failed.

A reward function that raises fails only its response (score 0, its ``reward_error``, counted in
the step's ``reward/failed``), so one odd sample never stops training. But when most of them fail
step after step (an upload whose ``data_source`` names no reward function, a custom function
with a bug) the policy learns from zeros, and such a run used to end ``succeeded``. The rule:
when more than ``POSTTRAIN_REWARD_FAILURE_RATE`` of a step's samples (``train_batch_size x
rollout.n``) failed in each of the last ``POSTTRAIN_REWARD_FAILURE_STEPS`` recorded steps, the
run gets a ``failure_reason``; its driver sees it as a stop request after the step, and
``driver_writes.run_finish`` ends the run ``failed`` with that reason, which its page shows. A run
that ends before that many steps, every one of them over the share, ends failed the same way.

The rule reads the newest recorded steps (one indexed query a step), so a step written again
after a database outage counts once, and it keeps no state of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings

from webapp.health.checks import REWARD_FAILED, RunContext
from webapp.runs.models import MetricPoint, Sample, SampleSplit


def failed_share(metrics: Mapping[str, Any], samples_per_step: int) -> float:
    """Return the share of a step's samples whose reward function failed (0 when none did)."""
    failed = metrics.get(REWARD_FAILED)
    if not isinstance(failed, int | float) or failed != failed or samples_per_step <= 0:
        return 0.0
    return min(1.0, float(failed) / samples_per_step)


def _first_error(run_id: int, step: int) -> str:
    """Return the first line of one reward error of ``step``'s training samples, or ''."""
    error = (
        Sample.objects.filter(run_id=run_id, step=step, split=SampleSplit.TRAIN)
        .exclude(reward_error=None)
        .exclude(reward_error="")
        .values_list("reward_error", flat=True)
        .first()
    )
    return (error or "").strip().partition("\n")[0][:300]


def reward_failure_reason(
    *, run_id: int, config: Mapping[str, Any], whole_run: bool = False
) -> str | None:
    """Return why the run must end failed because its rewards keep failing, or None.

    The last ``POSTTRAIN_REWARD_FAILURE_STEPS`` recorded steps must each be over the share; with
    ``whole_run`` (a run about to end) fewer steps do when they are all the run recorded.
    """
    samples = RunContext.from_config(config).samples_per_step
    rate = settings.POSTTRAIN_REWARD_FAILURE_RATE
    steps = settings.POSTTRAIN_REWARD_FAILURE_STEPS
    if not samples or rate >= 1:
        return None
    points = list(
        MetricPoint.objects.filter(run_id=run_id)
        .order_by("-step")
        .values_list("step", "metrics")[: steps + 1 if whole_run else steps]
    )
    if whole_run and len(points) > steps:
        points = points[:steps]  # a run this long is judged by the streak alone
    elif len(points) < steps and not (whole_run and points):
        return None
    shares = [failed_share(metrics, samples) for _, metrics in points]
    if not all(share > rate for share in shares):
        return None
    last, first = points[0][0], points[-1][0]
    where = f"step {last}" if last == first else f"each of steps {first}-{last}"
    error = _first_error(run_id, last)
    return (
        f"the reward function failed on more than {rate:.0%} of the samples in {where} "
        f"({shares[0]:.0%} at step {last}), so the run stopped: it was learning from zero "
        "rewards."
        + (f' One of the errors: "{error}".' if error else "")
        + " Each sample's error is in the sample inspector. The studio's "
        "POSTTRAIN_REWARD_FAILURE_RATE and POSTTRAIN_REWARD_FAILURE_STEPS set this rule."
    )
