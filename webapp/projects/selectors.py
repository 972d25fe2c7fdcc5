"""Read queries on projects: members and the projects an experiment may move into."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from webapp.projects.access import EDIT, project_ids
from webapp.projects.models import Membership, Project


def project_members(*, project: Project) -> QuerySet[Membership]:
    """Return the project's members (its owner is not among them), by username."""
    return project.memberships.select_related("user")


def project_move_targets(*, user: Any) -> QuerySet[Project]:
    """Return the projects ``user`` may move an experiment into: owned, or editor in."""
    return Project.objects.filter(pk__in=project_ids(user, need=EDIT))
