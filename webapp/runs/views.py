"""Run pages: detail, config diff, and the lifecycle actions (cancel, resume, clone, delete).

The run page leaves a container for the live charts (``#run-live``, with the run's Channels
group in ``data-group``) that the charts script fills.
"""

from __future__ import annotations

import yaml
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from engine.config import ConfigValidationError
from webapp.experiments.configs import as_config
from webapp.experiments.views import builder_for_config, yaml_response
from webapp.runs.models import Run
from webapp.runs.selectors import (
    run_config_diff,
    run_latest_checkpoint,
    run_latest_metrics,
    run_list_for_user,
)
from webapp.runs.services import RunStateError, run_cancel, run_delete, run_resume


def _run(request: HttpRequest, run_id: int) -> Run:
    return get_object_or_404(run_list_for_user(user=request.user), pk=run_id)


@login_required
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = _run(request, run_id)
    step, metrics = run_latest_metrics(run=run)
    context = {
        "run": run,
        "experiment": run.experiment,
        "metrics_step": step,
        "metrics": metrics,
        "checkpoint": run_latest_checkpoint(run=run),
        "children": run.children.all(),
        "sample_count": run.samples.count(),
        "other_runs": run_list_for_user(user=request.user).exclude(pk=run.pk)[:50],
        "config_yaml": yaml.safe_dump(run.config, sort_keys=False, allow_unicode=True),
    }
    return render(request, "runs/detail.html", context)


@login_required
@require_POST
def run_cancel_view(request: HttpRequest, run_id: int) -> HttpResponse:
    run = run_cancel(run=_run(request, run_id))
    if run.status == "cancelled":
        messages.success(request, f"Run #{run.number} cancelled.")
    elif run.cancel_requested and run.is_active:
        messages.success(request, f"Run #{run.number} stops after its current step.")
    else:
        messages.info(request, f"Run #{run.number} had already ended ({run.status}).")
    return redirect(run)


@login_required
@require_POST
def run_resume_view(request: HttpRequest, run_id: int) -> HttpResponse:
    run = _run(request, run_id)
    try:
        resumed = run_resume(run=run)
    except (RunStateError, ConfigValidationError) as exc:
        messages.error(request, str(exc))
        return redirect(run)
    messages.success(request, f"Run #{resumed.number} queued; it continues run #{run.number}.")
    return redirect(resumed)


@login_required
@require_POST
def run_delete_view(request: HttpRequest, run_id: int) -> HttpResponse:
    run = _run(request, run_id)
    try:
        run_delete(run=run)
    except RunStateError as exc:
        messages.error(request, str(exc))
        return redirect(run)
    messages.success(request, f"Run #{run.number} deleted.")
    return redirect(run.experiment)


@login_required
def run_clone(request: HttpRequest, run_id: int) -> HttpResponse:
    run = _run(request, run_id)
    return builder_for_config(
        request,
        as_config(run.config),
        name=f"{run.experiment.name} (from run #{run.number})",
        preset=run.experiment.preset,
        source=f"run #{run.number} of {run.experiment.name}",
    )


@login_required
def run_yaml(request: HttpRequest, run_id: int) -> HttpResponse:
    run = _run(request, run_id)
    return yaml_response(run.config, f"run-{run.pk}.yaml")


@login_required
def run_diff_pick(request: HttpRequest, run_id: int) -> HttpResponse:
    """Redirect the run page's "compare with" form to the diff page."""
    run = _run(request, run_id)
    other = request.GET.get("other", "")
    if not other.isdigit():
        messages.error(request, "Pick a run to compare with.")
        return redirect(run)
    other_run = _run(request, int(other))
    return redirect("runs:diff", run_id=run.pk, other_run_id=other_run.pk)


@login_required
def run_diff(request: HttpRequest, run_id: int, other_run_id: int) -> HttpResponse:
    left, right = _run(request, run_id), _run(request, other_run_id)
    rows = run_config_diff(left=left, right=right)
    return render(request, "runs/diff.html", {"left": left, "right": right, "rows": rows})
