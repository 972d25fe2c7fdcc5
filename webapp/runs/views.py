"""Run pages: the runs table, detail, config diff, notes and tags, and the lifecycle actions
(cancel, resume, clone, delete).

The run page leaves a container for the live charts (``#run-live``, with the run's Channels
group in ``data-group``) that the charts script fills.
"""

from __future__ import annotations

import csv
import re
from typing import Any

import yaml
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    JsonResponse,
    QueryDict,
    StreamingHttpResponse,
)
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from engine.config import ConfigValidationError
from webapp.experiments.configs import as_config
from webapp.experiments.views import (
    builder_for_config,
    flash_already_launched,
    flash_launched,
    yaml_response,
)
from webapp.runs.metrics import (
    DEFAULT_MAX_POINTS,
    run_metric_series,
    run_metrics_csv_rows,
    run_metrics_json,
)
from webapp.runs.models import Run, RunStatus
from webapp.runs.quotas import LaunchRefused
from webapp.runs.selectors import (
    run_config_diff,
    run_latest_checkpoint,
    run_latest_metrics,
    run_list_for_user,
)
from webapp.runs.services import (
    AlreadyLaunched,
    RunAnnotationError,
    RunStateError,
    refuse_external,
    run_add_tags,
    run_cancel,
    run_delete,
    run_remove_tag,
    run_resume,
    run_set_notes,
)
from webapp.runs.state import run_state
from webapp.runs.table import (
    BASE_SORTS,
    DEFAULT_SORT,
    RunTableQuery,
    RunTableQueryError,
    parse_run_table_query,
    run_table,
    run_table_metric_names,
    run_table_tags,
)


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
        "run_state": run_state(run),
        "other_runs": run_list_for_user(user=request.user).exclude(pk=run.pk)[:50],
        "config_yaml": yaml.safe_dump(run.config, sort_keys=False, allow_unicode=True),
    }
    return render(request, "runs/detail.html", context)


@login_required
@require_POST
def run_cancel_view(request: HttpRequest, run_id: int) -> HttpResponse:
    run = _run(request, run_id)
    try:
        run = run_cancel(run=run)
    except RunStateError as exc:
        messages.error(request, str(exc))
        return redirect(run)
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
        resumed = run_resume(run=run, launch_key=request.POST.get("launch_key", ""))
    except AlreadyLaunched as exc:
        return flash_already_launched(request, exc)
    except (RunStateError, ConfigValidationError, LaunchRefused) as exc:
        messages.error(request, str(exc))
        return redirect(run)
    flash_launched(
        request, resumed, f"Run #{resumed.number} queued; it continues run #{run.number}."
    )
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
    try:
        refuse_external(experiment=run.experiment, action="clone")
    except RunStateError as exc:
        messages.error(request, str(exc))
        return redirect(run)
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


def _whole_number(request: HttpRequest, key: str, default: int | None) -> int | None:
    value = request.GET.get(key, "").strip()
    if not value:
        return default
    if not value.isdigit():
        raise ValueError(f"{key}={value!r} is not a whole number; pass e.g. {key}=100")
    return int(value)


@login_required
def run_metrics_series(request: HttpRequest, run_id: int) -> JsonResponse:
    """Return the run's series (``?name=`` repeated, ``from``/``to`` steps, ``points``) as JSON.

    The charts call it when the user zooms: the step range comes back downsampled to the same
    point budget as the whole run, so the zoomed view shows finer detail.
    """
    run = _run(request, run_id)
    try:
        step_min = _whole_number(request, "from", None)
        step_max = _whole_number(request, "to", None)
        points = _whole_number(request, "points", DEFAULT_MAX_POINTS)
        names = request.GET.getlist("name") or None
        result = run_metric_series(
            run_id=run.pk, names=names, step_min=step_min, step_max=step_max, max_points=points
        )
    except ValueError as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    return JsonResponse({"run_id": run.pk, "from": step_min, "to": step_max, **result})


def _export_name(run: Run, extension: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", run.experiment.name).strip("-").lower() or "run"
    return f"{slug}-run{run.number}-metrics.{extension}"


class _Echo:
    def write(self, value: str) -> str:
        return value


@login_required
def run_metrics_csv(request: HttpRequest, run_id: int) -> StreamingHttpResponse:
    """Download every recorded step of the run's metrics as CSV, streamed row by row."""
    run = _run(request, run_id)
    writer = csv.writer(_Echo())
    rows = (writer.writerow(row) for row in run_metrics_csv_rows(run_id=run.pk))
    response = StreamingHttpResponse(rows, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{_export_name(run, "csv")}"'
    return response


@login_required
def run_metrics_json_view(request: HttpRequest, run_id: int) -> JsonResponse:
    """Download every recorded step of the run's metrics as JSON columns."""
    run = _run(request, run_id)
    response = JsonResponse(run_metrics_json(run_id=run.pk))
    response["Content-Disposition"] = f'attachment; filename="{_export_name(run, "json")}"'
    return response


COMPARE_MAX_RUNS = 8


@login_required
def run_compare(request: HttpRequest) -> HttpResponse:
    """Overlay the metrics of several of the user's runs (``?run=1&run=2``); live ones move."""
    ids = request.GET.getlist("run")
    if not all(i.isdigit() for i in ids):
        messages.error(request, "Pick runs from the list to compare.")
        ids = []
    ids = list(dict.fromkeys(int(i) for i in ids))
    if len(ids) > COMPARE_MAX_RUNS:
        messages.error(request, f"Compare at most {COMPARE_MAX_RUNS} runs; showing the first ones.")
        ids = ids[:COMPARE_MAX_RUNS]
    mine = run_list_for_user(user=request.user)
    chosen = {run.pk: run for run in mine.filter(pk__in=ids)}
    if len(chosen) != len(ids):
        raise Http404("No such run among yours.")
    context = {
        "runs": [chosen[i] for i in ids],
        "choices": mine[:100],
        "selected": set(ids),
    }
    return render(request, "runs/compare.html", context)


def _table_url(query: RunTableQuery, **changes: Any) -> str:
    """Return the runs table's URL for ``query`` with ``changes`` (metrics, sort) applied."""
    params = QueryDict(mutable=True)
    metrics = changes.get("metrics", query.metrics)
    params.setlist("metric", [m.param for m in metrics])
    params["sort"] = changes.get("sort", query.sort_param)
    params.setlist("tag", list(query.tags))
    params.setlist("status", list(query.statuses))
    params.setlist("config", list(query.config_params))
    return f"{reverse('runs:list')}?{params.urlencode(safe='/:')}"


def _sort_url(query: RunTableQuery, column: str) -> dict[str, Any]:
    """Return a header's link: sorted by ``column``, descending first, flipped when it is on."""
    on = query.sort == column
    descending = not query.descending if on else True
    order = ("desc" if query.descending else "asc") if on else ""
    return {"url": _table_url(query, sort=("-" if descending else "") + column), "order": order}


@login_required
def run_table_view(request: HttpRequest) -> HttpResponse:
    """The member's runs across experiments, with metric columns, filters and sorting."""
    context: dict[str, Any] = {
        "metric_names": run_table_metric_names(user=request.user),
        "tags": run_table_tags(user=request.user),
        "statuses": RunStatus.values,
    }
    try:
        query = parse_run_table_query(request.GET)
    except RunTableQueryError as exc:
        context.update(errors=exc.errors, query=RunTableQuery(), rows=[], total=0, colspan=7)
        return render(request, "runs/list.html", context, status=400)
    rows, total = run_table(user=request.user, query=query)
    metrics = [
        {
            "column": metric,
            "last": _sort_url(query, f"last:{metric.name}"),
            "best": _sort_url(query, f"best:{metric.name}"),
            "remove_url": _table_url(
                query,
                metrics=[m for m in query.metrics if m != metric],
                sort=DEFAULT_SORT if query.sort.endswith(f":{metric.name}") else query.sort_param,
            ),
        }
        for metric in query.metrics
    ]
    context.update(
        query=query,
        rows=[(row, row.cells(query.metrics)) for row in rows],
        total=total,
        shown=len(rows),
        metrics=metrics,
        sorts={column: _sort_url(query, column) for column in BASE_SORTS},
        chosen_statuses=set(query.statuses),
        colspan=7 + 2 * len(metrics),
    )
    return render(request, "runs/list.html", context)


@login_required
@require_POST
def run_notes_view(request: HttpRequest, run_id: int) -> HttpResponse:
    run = _run(request, run_id)
    try:
        run_set_notes(run=run, notes=request.POST.get("notes", ""))
    except RunAnnotationError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Notes of run #{run.number} saved.")
    return redirect(run)


@login_required
@require_POST
def run_tags_view(request: HttpRequest, run_id: int) -> HttpResponse:
    """Add the comma-separated ``add`` tags, or remove the ``remove`` tag."""
    run = _run(request, run_id)
    try:
        if "remove" in request.POST:
            run_remove_tag(run=run, tag=request.POST["remove"])
        else:
            run_add_tags(run=run, tags=request.POST.get("add", ""))
    except RunAnnotationError as exc:
        messages.error(request, str(exc))
    return redirect(run)
