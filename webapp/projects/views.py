"""Project pages: the list (and a new project), a project's members and experiments, moving an
experiment in or out, and a run's read-only share link."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from webapp.flash import flash_outcome
from webapp.projects.access import (
    OWN,
    VIEW,
    experiment_for,
    project_for,
    project_role,
    run_for,
    visible_experiments,
    visible_projects,
)
from webapp.projects.models import Role
from webapp.projects.selectors import project_members, project_move_targets
from webapp.projects.services import (
    ProjectError,
    experiment_move,
    member_add,
    member_remove,
    member_set_role,
    project_create,
    run_share,
    run_share_open,
    run_unshare,
)
from webapp.reports.selectors import report_list_for_user


@login_required
def project_list(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        project = flash_outcome(
            request,
            lambda: project_create(
                owner=request.user,
                name=request.POST.get("name", ""),
                description=request.POST.get("description", ""),
            ),
            ProjectError,
            lambda created: f"Project {created.name} created.",
        )
        if project is not None:
            return redirect(project)
    projects = visible_projects(request.user)
    return render(request, "projects/list.html", {"projects": projects})


@login_required
def project_detail(request: HttpRequest, project_id: int) -> HttpResponse:
    project = project_for(request.user, project_id, VIEW)
    context = {
        "project": project,
        "role": project_role(request.user, project),
        "members": project_members(project=project),
        "experiments": visible_experiments(request.user).filter(project=project),
        "reports": report_list_for_user(user=request.user).filter(project=project),
        "roles": Role.choices,
    }
    return render(request, "projects/detail.html", context)


@login_required
@require_POST
def member_add_view(request: HttpRequest, project_id: int) -> HttpResponse:
    project = project_for(request.user, project_id, OWN)
    flash_outcome(
        request,
        lambda: member_add(
            project=project,
            by=request.user,
            username=request.POST.get("username", ""),
            role=request.POST.get("role", ""),
        ),
        ProjectError,
        lambda member: f"{member.user.username} added as {member.role}.",
    )
    return redirect(project)


def _user_id(request: HttpRequest) -> int:
    value = request.POST.get("user_id", "")
    if not value.isdecimal():
        raise ProjectError("pick a member")
    return int(value)


@login_required
@require_POST
def member_role_view(request: HttpRequest, project_id: int) -> HttpResponse:
    project = project_for(request.user, project_id, OWN)
    flash_outcome(
        request,
        lambda: member_set_role(
            project=project,
            by=request.user,
            user_id=_user_id(request),
            role=request.POST.get("role", ""),
        ),
        ProjectError,
        lambda member: f"{member.user.username} is now {member.role}.",
    )
    return redirect(project)


@login_required
@require_POST
def member_remove_view(request: HttpRequest, project_id: int) -> HttpResponse:
    project = project_for(request.user, project_id, OWN)
    flash_outcome(
        request,
        lambda: member_remove(project=project, by=request.user, user_id=_user_id(request)),
        ProjectError,
        "Member removed: their open pages of the project closed.",
    )
    return redirect(project)


@login_required
@require_POST
def experiment_move_view(request: HttpRequest, experiment_id: int) -> HttpResponse:
    """Move one of the member's own experiments into a project where they edit, or out of it."""
    experiment = experiment_for(request.user, experiment_id, OWN)
    value = request.POST.get("project_id", "")
    target = None
    if value:
        if (
            not value.isdecimal()
            or not project_move_targets(user=request.user).filter(pk=int(value)).exists()
        ):
            messages.error(request, "Pick a project where you are an editor or the owner.")
            return redirect(experiment)
        target = project_for(request.user, int(value), VIEW)
    experiment_move(experiment=experiment, by=request.user, project=target)
    where = f"into {target.name}" if target else "out of its project"
    messages.success(request, f"{experiment.name} moved {where}.")
    return redirect(experiment)


@login_required
@require_POST
def run_share_view(request: HttpRequest, run_id: int) -> HttpResponse:
    run = run_for(request.user, run_id, OWN)
    share = run_share(run=run, by=request.user)
    link = request.build_absolute_uri(share.get_absolute_url())
    messages.success(request, f"Read-only link for the server's users: {link}")
    return redirect(run)


@login_required
@require_POST
def run_unshare_view(request: HttpRequest, run_id: int) -> HttpResponse:
    run = run_for(request.user, run_id, OWN)
    run_unshare(run=run, by=request.user)
    messages.success(request, "Share link revoked: those who opened it no longer see the run.")
    return redirect(run)


@login_required
def run_shared_view(request: HttpRequest, share_token: str) -> HttpResponse:
    """Open a share link: the run becomes readable to this user until the link is revoked."""
    run = run_share_open(token=share_token, user=request.user)
    if run is None:
        raise Http404("This link was revoked or never existed.")
    return redirect(run)
