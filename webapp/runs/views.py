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
    FileResponse,
    Http404,
    HttpRequest,
    HttpResponse,
    JsonResponse,
    QueryDict,
    StreamingHttpResponse,
)
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from webapp.experiments.configs import as_config
from webapp.experiments.views import builder_for_config, yaml_response
from webapp.flash import flash_outcome
from webapp.projects.access import EDIT, OWN, VIEW, run_for, run_may
from webapp.projects.selectors import project_move_targets
from webapp.runs.bands import GROUP_MAX_POINTS, group_metric_series
from webapp.runs.checkpoints import (
    CheckpointJobRefused,
    archive_chunks,
    checkpoint_evaluate,
    checkpoint_export,
    checkpoint_hf_folder,
    run_checkpoints,
)
from webapp.runs.forms import CheckpointEvaluateForm
from webapp.runs.groups import (
    GROUP_MAX_MEMBERS,
    GroupByError,
    group_rows,
    run_groups_by_token,
    run_groups_for_user,
)
from webapp.runs.launching import launch_response
from webapp.runs.logs import LogSearchError, log_search, run_log_path
from webapp.runs.metrics import (
    DEFAULT_MAX_POINTS,
    metric_panels,
    run_metric_series,
    run_metrics_csv_rows,
    run_metrics_json,
)
from webapp.runs.models import Run, RunStatus
from webapp.runs.selectors import (
    run_config_diff,
    run_latest_checkpoint,
    run_latest_metrics,
    run_list_for_user,
)
from webapp.runs.services import (
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
    COLUMN_PARAMS,
    DEFAULT_SORT,
    RunTableQuery,
    RunTableQueryError,
    parse_run_table_query,
    run_table,
    run_table_column_params,
    run_table_config_keys,
    run_table_forget,
    run_table_metric_names,
    run_table_remember,
    run_table_remembered,
    run_table_tags,
)


def _run(request: HttpRequest, run_id: int, need: str = VIEW) -> Run:
    """The run, if the user holds ``need`` on it: 404 without a view right, 403 without ``need``."""
    return run_for(request.user, run_id, need)


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
        "may_own": run_may(request.user, run, OWN),
        **_checkpoints_context(request, run),
        "other_runs": run_list_for_user(user=request.user).exclude(pk=run.pk)[:50],
        "config_yaml": yaml.safe_dump(run.config, sort_keys=False, allow_unicode=True),
    }
    return render(request, "runs/detail.html", context)


def _checkpoints_context(request: HttpRequest, run: Run) -> dict[str, Any]:
    """The checkpoints and, for a member who may edit the run, the forms that ask for work on
    them, offering that member's own datasets."""
    may_edit = run_may(request.user, run, EDIT)
    return {
        "may_edit": may_edit,
        "checkpoints": run_checkpoints(run=run),
        "evaluate_form": CheckpointEvaluateForm(run=run, user=request.user) if may_edit else None,
    }


def _to_checkpoints(run: Run) -> HttpResponse:
    return redirect(f"{run.get_absolute_url()}#run-checkpoints")


@login_required
def run_checkpoints_view(request: HttpRequest, run_id: int) -> HttpResponse:
    """The run page's checkpoints section alone, which the page reads again as it changes."""
    run = _run(request, run_id)
    context = {"run": run, **_checkpoints_context(request, run)}
    return render(request, "runs/_checkpoints.html", context)


@login_required
def run_checkpoint_archive(request: HttpRequest, run_id: int, step: int) -> StreamingHttpResponse:
    """Download the checkpoint's Hugging Face folder as a tar, streamed as it is written."""
    run = _run(request, run_id)
    folder = checkpoint_hf_folder(run, step)
    if folder is None:
        raise Http404("This checkpoint has no Hugging Face folder yet: prepare its download.")
    name = f"run-{run.pk}-step-{step}-hf"
    response = StreamingHttpResponse(archive_chunks(folder, name), content_type="application/x-tar")
    response["Content-Disposition"] = f'attachment; filename="{name}.tar"'
    return response


@login_required
@require_POST
def run_checkpoint_export_view(request: HttpRequest, run_id: int, step: int) -> HttpResponse:
    run = _run(request, run_id, EDIT)
    flash_outcome(
        request,
        lambda: checkpoint_export(run=run, step=step, by=request.user),
        CheckpointJobRefused,
        f"Preparing the Hugging Face folder of step {step}; its download link shows here.",
    )
    return _to_checkpoints(run)


@login_required
@require_POST
def run_checkpoint_evaluate_view(request: HttpRequest, run_id: int, step: int) -> HttpResponse:
    run = _run(request, run_id, EDIT)
    form = CheckpointEvaluateForm(request.POST, run=run, user=request.user)
    if not form.is_valid():
        for field, errors in form.errors.items():
            messages.error(request, f"{field}: {' '.join(errors)}")
        return _to_checkpoints(run)
    flash_outcome(
        request,
        lambda: checkpoint_evaluate(run=run, step=step, by=request.user, **form.cleaned_data),
        CheckpointJobRefused,
        f"Evaluation of step {step} queued; its figures show here.",
    )
    return _to_checkpoints(run)


@login_required
@require_POST
def run_cancel_view(request: HttpRequest, run_id: int) -> HttpResponse:
    run = _run(request, run_id, EDIT)
    try:
        run = run_cancel(run=run)
    except RunStateError as exc:
        messages.error(request, str(exc))
        return redirect(run)
    if run.status == "cancelled":
        messages.success(request, f"Run #{run.pk} cancelled.")
    elif run.cancel_requested and run.is_active:
        messages.success(request, f"Run #{run.pk} stops after its current step.")
    else:
        messages.info(request, f"Run #{run.pk} had already ended ({run.status}).")
    return redirect(run)


@login_required
@require_POST
def run_resume_view(request: HttpRequest, run_id: int) -> HttpResponse:
    run = _run(request, run_id, EDIT)
    return launch_response(
        request,
        lambda key: run_resume(run=run, launch_key=key, launcher=request.user),
        refused_to=run,
        queued=lambda resumed: f"Run #{resumed.pk} queued; it continues run #{run.pk}.",
    )


@login_required
@require_POST
def run_delete_view(request: HttpRequest, run_id: int) -> HttpResponse:
    run = _run(request, run_id, OWN)
    try:
        run_delete(run=run)
    except RunStateError as exc:
        messages.error(request, str(exc))
        return redirect(run)
    messages.success(request, f"Run #{run.pk} deleted.")
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
        name=f"{run.experiment.name} (from run #{run.pk})",
        preset=run.experiment.preset,
        source=f"run #{run.pk} of {run.experiment.name}",
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
    if not other.isdecimal():
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
    if not value.isdecimal():
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
    return f"{slug}-run{run.pk}-metrics.{extension}"


class _Echo:
    def write(self, value: str) -> str:
        return value


@login_required
def run_log_download(request: HttpRequest, run_id: int) -> FileResponse:
    """Download the run's whole log (``driver.log``), streamed from its file."""
    run = _run(request, run_id)
    path = run_log_path(run)
    if path is None or not path.is_file():
        raise Http404("This run has no log yet: its driver has not started.")
    return FileResponse(
        open(path, "rb"),  # noqa: SIM115 - FileResponse closes it
        as_attachment=True,
        filename=f"run-{run.pk}-driver.log",
        content_type="text/plain; charset=utf-8",
    )


@login_required
def run_log_search_view(request: HttpRequest, run_id: int) -> JsonResponse:
    """Return the lines of the run's whole log that contain ``?q=`` (ignoring case), as JSON."""
    run = _run(request, run_id)
    try:
        found = log_search(run_log_path(run), request.GET.get("q", ""))
    except LogSearchError as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    matches = [{"line": number, "text": text} for number, text in found.matches]
    return JsonResponse({"matches": matches, "truncated": found.truncated})


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
    """Overlay the metrics of several of the user's runs (``?run=1&run=2``) and run groups
    (``?group=<token>``, drawn as a mean in a band); live ones move."""
    ids = request.GET.getlist("run")
    if not all(i.isdecimal() for i in ids):
        messages.error(request, "Pick runs from the list to compare.")
        ids = []
    ids = list(dict.fromkeys(int(i) for i in ids))
    tokens = list(dict.fromkeys(request.GET.getlist("group")))
    if len(ids) + len(tokens) > COMPARE_MAX_RUNS:
        messages.error(
            request, f"Compare at most {COMPARE_MAX_RUNS} runs and groups; showing the first ones."
        )
        tokens = tokens[:COMPARE_MAX_RUNS]
        ids = ids[: COMPARE_MAX_RUNS - len(tokens)]
    mine = run_list_for_user(user=request.user)
    chosen = {run.pk: run for run in mine.filter(pk__in=ids)}
    if len(chosen) != len(ids):
        raise Http404("No such run among yours.")
    try:
        groups = run_groups_by_token(user=request.user, tokens=tokens)
    except GroupByError as exc:
        messages.error(request, str(exc))
        groups = []
    except Run.DoesNotExist:
        raise Http404("No such group among your runs.") from None
    context = {
        "runs": [chosen[i] for i in ids],
        "groups": groups,
        "choices": mine[:100],
        "group_choices": run_groups_for_user(user=request.user),
        "selected": set(ids),
        "selected_groups": set(tokens),
        "projects": project_move_targets(user=request.user),
    }
    return render(request, "runs/compare.html", context)


@login_required
def run_group_series(request: HttpRequest) -> JsonResponse:
    """Return the band series of the runs ``?run=`` (repeated) as JSON: mean, min, max, std, n.

    ``name`` (repeated), ``from``, ``to`` and ``points`` as for one run's series; every run must
    be one the user may see (else 404).
    """
    ids = request.GET.getlist("run")
    if not ids or not all(i.isdecimal() for i in ids) or len(ids) > GROUP_MAX_MEMBERS:
        return JsonResponse(
            {"error": f"pass 1 to {GROUP_MAX_MEMBERS} run ids as run=<id>, repeated"}, status=400
        )
    run_ids = list(dict.fromkeys(int(i) for i in ids))
    if run_list_for_user(user=request.user).filter(pk__in=run_ids).count() != len(run_ids):
        raise Http404("No such run among yours.")
    try:
        result = group_metric_series(
            run_ids=run_ids,
            names=request.GET.getlist("name") or None,
            step_min=_whole_number(request, "from", None),
            step_max=_whole_number(request, "to", None),
            max_points=_whole_number(request, "points", GROUP_MAX_POINTS),
        )
    except ValueError as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    panels = metric_panels(result["series"])
    return JsonResponse({"runs": run_ids, "panels": panels, **result})


def _table_params(query: RunTableQuery, **changes: Any) -> QueryDict:
    """Return the runs table's parameters for ``query`` with ``changes`` applied."""
    params = QueryDict(mutable=True)
    metrics = changes.get("metrics", query.metrics)
    # An empty metric= says "these columns, none": a link without it gets the member's own.
    params.setlist("metric", [m.param for m in metrics] or [""])
    params.setlist("col", [c.key for c in changes.get("columns", query.columns)])
    params["sort"] = changes.get("sort", query.sort_param)
    if query.group:
        params["group"] = query.group
    if changes.get("filters", True):
        params.setlist("tag", list(query.tags))
        params.setlist("status", list(query.statuses))
        params.setlist("config", list(query.config_params))
    return params


def _table_url(query: RunTableQuery, **changes: Any) -> str:
    """Return the runs table's URL for ``query`` with ``changes`` (columns, sort) applied."""
    return f"{reverse('runs:list')}?{_table_params(query, **changes).urlencode(safe='/:')}"


def _sort_url(query: RunTableQuery, column: str) -> dict[str, Any]:
    """Return a header's link: sorted by ``column``, descending first, flipped when it is on."""
    on = query.sort == column
    descending = not query.descending if on else True
    order = ("desc" if query.descending else "asc") if on else ""
    return {"url": _table_url(query, sort=("-" if descending else "") + column), "order": order}


def _unsorted_by(query: RunTableQuery, column: str) -> str:
    """Return the sort to keep when ``column``'s values leave the table."""
    return DEFAULT_SORT if query.sort == column else query.sort_param


@login_required
def run_table_view(request: HttpRequest) -> HttpResponse:
    """The member's runs across experiments, with metric and config columns, filters, sorting.

    A link that names no columns opens with the member's last ones (kept on the server); a
    readable query becomes their new ones. A query with errors is shown without its bad parts,
    the columns and what was typed kept, each problem named.
    """
    if "reset" in request.GET:
        run_table_forget(user=request.user)
        return redirect("runs:list")
    if not any(name in request.GET for name in COLUMN_PARAMS):
        kept = run_table_remembered(user=request.user)
        if kept:
            params = request.GET.copy()
            for name in COLUMN_PARAMS:  # in this order: jsonb keeps none
                values = kept.get(name, [])
                params.setlist(name, values or ([""] if name == "metric" else []))
            return redirect(f"{reverse('runs:list')}?{params.urlencode(safe='/:')}")
    errors: list[str] = []
    try:
        query = parse_run_table_query(request.GET)
    except RunTableQueryError as exc:
        query, errors = exc.query, exc.errors
    else:
        if run_table_remembered(user=request.user) != run_table_column_params(query):
            run_table_remember(user=request.user, query=query)
    rows, total = run_table(user=request.user, query=query)
    table_rows = [(row, row.cells(query.metrics), row.config_cells(query.columns)) for row in rows]
    # Each row with the group it opens or belongs to ("group by"), None when ungrouped.
    group_by, grouped = query.group, None
    marked = [(*row, None) for row in table_rows]
    if group_by:
        try:
            grouped = group_rows(table_rows, by=group_by, run_of=lambda row: row[0].run)
        except GroupByError as exc:
            errors.append(str(exc))
        else:
            marked = [
                (*row, group and {"group": group, "first": i == 0})
                for group, members in grouped
                for i, row in enumerate(members)
            ]
    metrics = [
        {
            "column": metric,
            "last": _sort_url(query, f"last:{metric.name}"),
            "best": _sort_url(query, f"best:{metric.name}"),
            "remove_url": _table_url(
                query,
                metrics=[m for m in query.metrics if m != metric],
                sort=DEFAULT_SORT
                if query.sort.endswith(f":{metric.name}")
                and query.sort.startswith(("last", "best"))
                else query.sort_param,
            ),
        }
        for metric in query.metrics
    ]
    columns = [
        {
            "column": column,
            "sort": _sort_url(query, f"config:{column.key}"),
            "remove_url": _table_url(
                query,
                columns=[c for c in query.columns if c != column],
                sort=_unsorted_by(query, f"config:{column.key}"),
            ),
        }
        for column in query.columns
    ]
    context = {
        "metric_names": run_table_metric_names(user=request.user),
        "config_keys": run_table_config_keys(user=request.user),
        "tags": run_table_tags(user=request.user),
        "statuses": RunStatus.values,
        "errors": errors,
        "query": query,
        "rows": marked,
        "group_by": group_by,
        "grouped": grouped,
        "total": total,
        "shown": len(rows),
        "metrics": metrics,
        "columns": columns,
        "sorts": {column: _sort_url(query, column) for column in BASE_SORTS},
        "chosen_statuses": set(query.statuses),
        "colspan": 8 + len(columns) + 2 * len(metrics),
        "unfiltered_url": _table_url(query, filters=False),
    }
    return render(request, "runs/list.html", context, status=400 if errors else 200)


@login_required
@require_POST
def run_notes_view(request: HttpRequest, run_id: int) -> HttpResponse:
    run = _run(request, run_id, EDIT)
    flash_outcome(
        request,
        lambda: run_set_notes(run=run, notes=request.POST.get("notes", "")),
        RunAnnotationError,
        f"Notes of run #{run.pk} saved.",
    )
    return redirect(run)


@login_required
@require_POST
def run_tags_view(request: HttpRequest, run_id: int) -> HttpResponse:
    """Add the comma-separated ``add`` tags, or remove the ``remove`` tag."""
    run = _run(request, run_id, EDIT)
    try:
        if "remove" in request.POST:
            run_remove_tag(run=run, tag=request.POST["remove"])
        else:
            run_add_tags(run=run, tags=request.POST.get("add", ""))
    except RunAnnotationError as exc:
        messages.error(request, str(exc))
    return redirect(run)
