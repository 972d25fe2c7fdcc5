"""Read queries on experiments: the list a user sees, with search and filters."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, OuterRef, Q, QuerySet, Subquery

from webapp.experiments.models import Experiment
from webapp.projects.access import visible_experiments
from webapp.runs.models import Run


def experiment_list_for_user(
    *,
    user: Any,
    search: str = "",
    tag: str = "",
    status: str = "",
    archived: bool | None = False,
) -> QuerySet[Experiment]:
    """Return the experiments ``user`` may read (their own, their projects') with ``run_count`` and ``latest_status`` (of the newest run).

    ``search`` matches name, description and tags; ``status`` the newest run's status;
    ``archived=None`` returns archived and active experiments together.
    """
    latest = Run.objects.filter(experiment=OuterRef("pk")).order_by("-created_at")
    experiments = visible_experiments(user).annotate(
        run_count=Count("runs"), latest_status=Subquery(latest.values("status")[:1])
    )
    if archived is not None:
        experiments = experiments.filter(archived=archived)
    if search.strip():
        term = search.strip()
        experiments = experiments.filter(
            Q(name__icontains=term)
            | Q(description__icontains=term)
            | Q(tags__contains=[term.lower()])
        )
    if tag.strip():
        experiments = experiments.filter(tags__contains=[tag.strip().lower()])
    if status:
        experiments = experiments.filter(latest_status=status)
    return experiments


def experiment_tags_for_user(*, user: Any) -> list[str]:
    """Return every tag on the experiments ``user`` may read, sorted."""
    tags = visible_experiments(user).values_list("tags", flat=True)
    return sorted({t for row in tags for t in row})
