"""Sweep pages: create from the builder, list, detail (table, chart, live overlay), cancel.

Views parse and authorise; ``services`` decide. Another user's sweep is a 404 everywhere.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from engine.config import ConfigValidationError
from webapp.experiments.forms import ExperimentForm
from webapp.experiments.services import experiment_create
from webapp.experiments.views import render_builder
from webapp.projects.access import EDIT, VIEW, sweep_for
from webapp.runs.groups import GroupByError, RunGroup, group_runs, split_groups
from webapp.runs.models import Run
from webapp.runs.quotas import LaunchRefused
from webapp.runs.selectors import run_list_for_user
from webapp.sweeps.forms import SweepForm
from webapp.sweeps.models import Sweep
from webapp.sweeps.selectors import (
    REWARD_METRIC,
    sweep_keys,
    sweep_list_for_user,
    sweep_member_rows,
    sweep_state,
)
from webapp.sweeps.services import SweepAlreadyCreated, SweepInvalid, sweep_cancel, sweep_create

# The live overlay opens one socket per member; past this many it shows the first ones.
OVERLAY_MAX_MEMBERS = 24


def _sweep(request: HttpRequest, sweep_id: int, need: str = VIEW) -> Sweep:
    """The sweep if the user holds ``need`` on it (``webapp.projects.access``)."""
    return sweep_for(request.user, sweep_id, need, queryset=sweep_list_for_user(user=request.user))


@login_required
def sweep_list(request: HttpRequest) -> HttpResponse:
    return render(request, "sweeps/list.html", {"sweeps": sweep_list_for_user(user=request.user)})


@login_required
@require_POST
def sweep_new(request: HttpRequest) -> HttpResponse:
    """Create the builder's experiment and a sweep over it, or show the builder with the errors."""
    form = ExperimentForm(request.POST, owner=request.user)
    sweep_form = SweepForm(request.POST)
    experiment_ok, sweep_ok = form.is_valid(), sweep_form.is_valid()
    if experiment_ok and sweep_ok:
        data = sweep_form.cleaned_data
        try:
            with transaction.atomic():
                experiment = experiment_create(
                    owner=request.user,
                    name=form.cleaned_data["name"],
                    config=form.config,
                    description=form.cleaned_data["description"],
                    tags=form.cleaned_data["tags"],
                    preset=form.cleaned_data["preset"],
                )
                sweep = sweep_create(
                    experiment=experiment,
                    name=experiment.name,
                    spec=sweep_form.spec,
                    concurrency=data["concurrency"],
                    launch_key=request.POST.get("launch_key", ""),
                )
        except SweepInvalid as exc:
            sweep_form.add_sweep_errors(exc)
        except ConfigValidationError as exc:
            form.add_config_errors(exc)
        except LaunchRefused as exc:
            sweep_form.add_error(None, str(exc))
        except SweepAlreadyCreated as exc:  # the experiment this POST made is rolled back
            messages.info(request, "This sweep was already created from this page.")
            return redirect(exc.sweep)
        else:
            count = sweep.members.count()
            messages.success(request, f"Sweep {sweep.name} queued: {count} runs.")
            return redirect(sweep)
    return render_builder(request, form, status=400, extra={"sweep_form": sweep_form})


@login_required
def sweep_detail(request: HttpRequest, sweep_id: int) -> HttpResponse:
    sweep = _sweep(request, sweep_id)
    rows = sweep_member_rows(sweep=sweep)
    context_keys = sweep_keys(sweep)
    overlay = []
    for row in rows[:OVERLAY_MAX_MEMBERS]:
        keys = (key.rsplit(".", 1)[-1] for key in context_keys)
        shown = ", ".join(f"{k}={v}" for k, v in zip(keys, row.values_text, strict=True))
        row.run.overlay_label = f"#{row.member.index} {shown}"
        overlay.append(row.run)
    overlay, groups, group_by = _grouped_overlay(request, rows, overlay)
    context = {
        "sweep": sweep,
        "keys": context_keys,
        "group_by": group_by,
        "overlay_groups": groups,
        "rows": rows,
        "overlay": overlay,
        "overlay_cut": len(rows) > OVERLAY_MAX_MEMBERS,
        "overlay_max": OVERLAY_MAX_MEMBERS,
        "reward_metric": REWARD_METRIC,
        "state": sweep_state(sweep=sweep, rows=rows),
    }
    return render(request, "sweeps/detail.html", context)


def _grouped_overlay(
    request: HttpRequest, rows: list[Any], overlay: list[Run]
) -> tuple[list[Run], list[RunGroup], str]:
    """Return the overlay's runs and groups under the page's ``?group=`` (seed, a key or none).

    Members are grouped among those the viewer may see (``run_list_for_user``); a member alone
    in its group stays a line of its own.
    """
    group_by = request.GET.get("group", "").strip()
    if not group_by:
        return overlay, [], ""
    visible = set(
        run_list_for_user(user=request.user)
        .filter(pk__in=[row.run.pk for row in rows])
        .values_list("pk", flat=True)
    )
    try:
        groups = group_runs([row.run for row in rows if row.run.pk in visible], by=group_by)
    except GroupByError as exc:
        messages.error(request, str(exc))
        return overlay, [], group_by
    several, alone = split_groups(groups)
    return alone[:OVERLAY_MAX_MEMBERS], several, group_by


@login_required
def sweep_state_view(request: HttpRequest, sweep_id: int) -> JsonResponse:
    """Return the sweep page's live part (``selectors.sweep_state``), read as its members move."""
    return JsonResponse(sweep_state(sweep=_sweep(request, sweep_id)))


@login_required
@require_POST
def sweep_cancel_view(request: HttpRequest, sweep_id: int) -> HttpResponse:
    sweep = sweep_cancel(sweep=_sweep(request, sweep_id, EDIT))
    messages.success(
        request, f"Sweep {sweep.name} cancelled; running members stop after their step."
    )
    return redirect(sweep)
