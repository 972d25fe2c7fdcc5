"""Report pages: the list (and a new report, also from the compare page), a report, its edit
form, its self-contained HTML export and its deletion. Who may do what: ``report_for``."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST, require_safe

from webapp.flash import flash_outcome
from webapp.projects.access import EDIT, OWN, VIEW, project_for, report_for, report_may
from webapp.projects.models import Project
from webapp.projects.selectors import project_move_targets
from webapp.reports.export import export_name, inline_static
from webapp.reports.selectors import report_list_for_user, report_view
from webapp.reports.services import (
    MAX_STEP,
    ReportError,
    report_create,
    report_delete,
    report_update,
)
from webapp.runs.groups import run_groups_for_user
from webapp.runs.selectors import run_list_for_user


def _id(value: str) -> bool:
    """Return whether ``value`` reads as a row id (ASCII digits, within a bigint)."""
    return value.isascii() and value.isdigit() and len(value) <= 18


def _project(request: HttpRequest) -> Project | None:
    value = request.POST.get("project_id", "")
    if not value:
        return None
    if not _id(value):
        raise ReportError("pick a project from the list")
    return project_for(request.user, int(value), VIEW)


def _run_ids(request: HttpRequest) -> list[int]:
    values = request.POST.getlist("run")
    if not all(_id(value) for value in values):
        raise ReportError("pick runs from the list")
    return [int(value) for value in values]


def _whole(request: HttpRequest, name: str, default: int | None) -> int | None:
    value = request.POST.get(name, "").strip()
    if not value:
        return default
    if not (value.isascii() and value.isdigit()) or int(value) > MAX_STEP:
        raise ReportError(f"{name}={value[:40]!r}: give a whole number up to {MAX_STEP:,}")
    return int(value)


@login_required
def report_list(request: HttpRequest) -> HttpResponse:
    """List the reports the user may read; POST saves a new one (the compare page posts here)."""
    if request.method == "POST":
        report = flash_outcome(
            request,
            lambda: report_create(
                owner=request.user,
                title=request.POST.get("title", ""),
                run_ids=_run_ids(request),
                group_tokens=request.POST.getlist("group"),
                project=_project(request),
                notes=request.POST.get("notes", ""),
            ),
            ReportError,
            lambda saved: f"Report {saved.title} saved; its link stays the same.",
            failed="The report was not saved: {exc}.",
        )
        if report is not None:
            return redirect(report)
    context = {
        "reports": report_list_for_user(user=request.user),
        "choices": run_list_for_user(user=request.user)[:100],
        "group_choices": run_groups_for_user(user=request.user),
        "projects": project_move_targets(user=request.user),
    }
    return render(request, "reports/list.html", context)


@login_required
@require_safe
def report_detail(request: HttpRequest, report_id: str) -> HttpResponse:
    report = report_for(request.user, report_id, VIEW)
    context = {
        "view": report_view(report=report, user=request.user),
        "may_edit": report_may(request.user, report, EDIT),
        "may_delete": report_may(request.user, report, OWN),
    }
    return render(request, "reports/detail.html", context)


@login_required
@require_POST
def report_edit(request: HttpRequest, report_id: str) -> HttpResponse:
    """Change the title, notes, metrics and sample table (the report's owner, project editors)."""
    report = report_for(request.user, report_id, EDIT)
    flash_outcome(
        request,
        lambda: report_update(
            report=report,
            title=request.POST.get("title", ""),
            notes=request.POST.get("notes", ""),
            metrics=request.POST.get("metrics", ""),
            sample_count=_whole(request, "samples", report.sample_count) or 0,
            sample_step=_whole(request, "step", None),
        ),
        ReportError,
        "Report saved.",
        failed="The report was not changed: {exc}.",
    )
    return redirect(report)


@login_required
@require_safe
def report_export(request: HttpRequest, report_id: str) -> HttpResponse:
    """Download the report as one HTML file that opens offline: scripts and data inlined."""
    report = report_for(request.user, report_id, VIEW)
    context = {
        "view": report_view(report=report, user=request.user),
        "plotly_js": inline_static("plotly/plotly.min.js"),
        "report_js": inline_static("js/report.js"),
        "report_css": inline_static("css/report.css"),
        "link": request.build_absolute_uri(report.get_absolute_url()),
    }
    response = render(request, "reports/export.html", context)
    response["Content-Disposition"] = f'attachment; filename="{export_name(report.title)}"'
    return response


@login_required
@require_POST
def report_delete_view(request: HttpRequest, report_id: str) -> HttpResponse:
    report = report_for(request.user, report_id, OWN)
    report_delete(report=report)
    messages.success(request, f"Report {report.title} deleted.")
    return redirect("reports:list")
