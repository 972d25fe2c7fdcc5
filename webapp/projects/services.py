"""Writes on projects: create one, add, remove and re-role members, move experiments, share runs.

Only the project's owner changes its members; a change that takes a right away tells the live
sockets concerned to check again once it commits (``webapp.projects.access.access_changed``),
so a removed member's open run pages stop at once.
"""

from __future__ import annotations

import secrets
from functools import partial
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction

from webapp.experiments.models import Experiment
from webapp.projects.access import (
    OWN,
    RANK,
    access_changed,
    project_role,
    run_may,
)
from webapp.projects.models import Membership, Project, Role, RunShare
from webapp.runs.models import Run

MAX_PROJECT_NAME = 200


class ProjectError(ValueError):
    """A project change that cannot be made, with the reason the member can act on."""


def _owner_only(project: Project, by: Any) -> None:
    if project.owner_id != by.pk:
        raise PermissionDenied("Only the project's owner changes its members.")


def project_create(*, owner: Any, name: str, description: str = "") -> Project:
    """Create ``owner``'s project ``name`` (ProjectError for an empty or a repeated name)."""
    name = name.strip()
    if not name or len(name) > MAX_PROJECT_NAME:
        raise ProjectError(f"a project needs a name of 1 to {MAX_PROJECT_NAME} characters")
    if Project.objects.filter(owner=owner, name=name).exists():
        raise ProjectError(f"you already have a project named {name!r}; pick another name")
    try:
        with transaction.atomic():
            return Project.objects.create(owner=owner, name=name, description=description)
    except IntegrityError:  # a second request with the same name won the race
        raise ProjectError(f"you already have a project named {name!r}") from None


def _role(role: str) -> str:
    if role not in Role.values:
        raise ProjectError(f"role={role!r} is not a role; pick one of {', '.join(Role.values)}")
    return role


def member_add(*, project: Project, by: Any, username: str, role: str) -> Membership:
    """Add user ``username`` to ``project`` as ``role`` (by the project's owner only)."""
    _owner_only(project, by)
    role = _role(role)
    user = get_user_model().objects.filter(username=username.strip(), is_active=True).first()
    if user is None:
        raise ProjectError(f"no active user is named {username.strip()!r} on this server")
    if user.pk == project.owner_id:
        raise ProjectError("the project's owner is a member already, as its owner")
    membership, created = Membership.objects.get_or_create(
        project=project, user=user, defaults={"role": role}
    )
    if not created:
        raise ProjectError(f"{user.username} is a member already ({membership.role})")
    return membership


def member_set_role(*, project: Project, by: Any, user_id: int, role: str) -> Membership:
    """Change a member's role (by the project's owner only); an editor made viewer keeps reading."""
    _owner_only(project, by)
    role = _role(role)
    membership = Membership.objects.filter(project=project, user_id=user_id).first()
    if membership is None:
        raise ProjectError(f"user #{user_id} is not a member of {project.name}")
    membership.role = role
    membership.save(update_fields=["role"])
    return membership


def member_remove(*, project: Project, by: Any, user_id: int) -> None:
    """Remove a member (by the project's owner only); its open sockets of the project close."""
    _owner_only(project, by)
    deleted, _ = Membership.objects.filter(project=project, user_id=user_id).delete()
    if not deleted:
        raise ProjectError(f"user #{user_id} is not a member of {project.name}")
    transaction.on_commit(partial(access_changed, user_ids=[user_id]))


def experiment_move(*, experiment: Experiment, by: Any, project: Project | None) -> Experiment:
    """Move ``experiment`` (and so its runs) into ``project``, or out of any with None.

    ``by`` must own the experiment, and be the new project's owner or one of its editors.
    Members of the project it leaves lose it, their open sockets included.
    """
    # Its owner only: a project's owner moving a member's experiment into another project would
    # show it to people its owner never chose.
    if experiment.owner_id != by.pk:
        raise PermissionDenied("Only the experiment's owner moves it.")
    if project is not None and RANK.get(project_role(by, project) or "", 0) < RANK["editor"]:
        raise PermissionDenied("Move experiments only into projects where you are an editor.")
    old = experiment.project
    experiment.project = project
    experiment.save(update_fields=["project"])
    if old is not None and old != project:
        users = [old.owner_id, *old.memberships.values_list("user_id", flat=True)]
        runs = list(experiment.runs.values_list("pk", flat=True))
        transaction.on_commit(partial(access_changed, user_ids=users, run_ids=runs))
    return experiment


def run_share(*, run: Run, by: Any) -> RunShare:
    """Return the run's read-only share link, made now if it had none (by its owner only)."""
    if not run_may(by, run, OWN):
        raise PermissionDenied("Only the run's owner shares it.")
    share = RunShare.objects.filter(run=run).first()
    return share or RunShare.objects.create(run=run, token=secrets.token_urlsafe(32))


def run_unshare(*, run: Run, by: Any) -> None:
    """Revoke the run's share link: everyone who read it through the link loses it at once."""
    if not run_may(by, run, OWN):
        raise PermissionDenied("Only the run's owner revokes its link.")
    RunShare.objects.filter(run=run).delete()
    transaction.on_commit(partial(access_changed, run_ids=[run.pk]))


def run_share_open(*, token: str, user: Any) -> Run | None:
    """Record that ``user`` opened share link ``token``; return its run, or None if revoked."""
    share = RunShare.objects.filter(token=token).select_related("run").first()
    if share is None:
        return None
    share.grants.get_or_create(user=user)
    return share.run
