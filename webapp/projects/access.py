"""Who may see and change what: the one check every page, API route and socket goes through.

A user's role on an object is one of, from least to most:

- ``viewer``: reads everything of it (pages, charts, samples, logs, configs, exports): a viewer
  member of the object's project, or a user who opened the run's share link
  (``webapp.projects.models.RunShare``; that run only);
- ``editor``: also creates, launches, cancels, tags and notes: an editor member of the project;
- ``owner``: also deletes, archives, moves and shares: the object's owner (a run's launcher, its
  experiment's owner) or the project's owner.

The checks answer as the studio always has for an object that is not the user's: **404** when
the user may not even see it (the same answer as for an id that does not exist, so ids reveal
nothing), and **403** when the user sees it but lacks the role (``need``) the action asks.
A report (``webapp.reports``) is read by its owner and its project's members, edited by its
editors and deleted by its owner or the project's owner; the runs it shows are each checked
again for its reader. Anonymous users see nothing. Quotas stay per person
(``webapp.runs.quotas``: the launching member's), and datasets, API tokens and alert settings
stay their owner's own.

The live sockets (``webapp.runs.consumers``) join :func:`access_user_group` and the run's group;
a change that takes a right away (a member removed, an experiment moved out, a share revoked)
sends :data:`ACCESS_CHANGED` there, and each socket checks again and closes with 4403.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import Http404

from webapp.experiments.models import Experiment
from webapp.projects.models import Membership, Project, Role, RunShareGrant
from webapp.reports.models import Report
from webapp.runs.models import Run
from webapp.sweeps.models import Sweep

logger = logging.getLogger(__name__)

VIEW, EDIT, OWN = "view", "edit", "own"
NEEDS = (VIEW, EDIT, OWN)
OWNER = "owner"
RANK = {str(Role.VIEWER): 1, str(Role.EDITOR): 2, OWNER: 3}
NEED_RANK = {VIEW: 1, EDIT: 2, OWN: 3}
ACCESS_CHANGED = "access.changed"  # handled by the run socket's ``access_changed``


def access_user_group(user_id: int) -> str:
    """Return the channel group of every live socket ``user_id`` has open."""
    return f"access.user.{user_id}"


def _authenticated(user: Any) -> bool:
    return user is not None and getattr(user, "is_authenticated", False)


def project_ids(user: Any, *, need: str = VIEW) -> QuerySet:
    """Return a subquery of the ids of the projects where ``user`` holds ``need`` or more."""
    if need not in NEED_RANK:
        raise ValueError(f"need={need!r}; one of {NEEDS}")
    owned = Q(owner=user)
    if need == OWN:
        return Project.objects.filter(owned).values("pk")
    roles = [r for r, rank in RANK.items() if rank >= NEED_RANK[need] and r != OWNER]
    member = Q(pk__in=Membership.objects.filter(user=user, role__in=roles).values("project_id"))
    return Project.objects.filter(owned | member).values("pk")


def visible_projects(user: Any) -> QuerySet[Project]:
    """Return the projects ``user`` owns or is a member of."""
    if not _authenticated(user):
        return Project.objects.none()
    return Project.objects.filter(pk__in=project_ids(user)).select_related("owner")


def project_role(user: Any, project: Project | None) -> str | None:
    """Return ``owner``, ``editor``, ``viewer`` or None: ``user``'s role in ``project``."""
    if project is None or not _authenticated(user):
        return None
    if project.owner_id == user.pk:
        return OWNER
    found = Membership.objects.filter(project=project, user=user).values_list("role", flat=True)
    return next(iter(found), None)


def _experiment_q(user: Any, need: str, prefix: str = "") -> Q:
    return Q(**{f"{prefix}owner": user}) | Q(
        **{f"{prefix}project_id__in": project_ids(user, need=need)}
    )


def visible_experiments(user: Any, *, need: str = VIEW) -> QuerySet[Experiment]:
    """Return the experiments ``user`` holds ``need`` on: their own and their projects'."""
    if not _authenticated(user):
        return Experiment.objects.none()
    return Experiment.objects.filter(_experiment_q(user, need))


def _run_q(user: Any, need: str) -> Q:
    # The launcher owns its run, however its experiment moved since.
    q = Q(owner=user) | _experiment_q(user, need, prefix="experiment__")
    if need == VIEW:
        q |= Q(pk__in=RunShareGrant.objects.filter(user=user).values("share__run_id"))
    return q


def visible_runs(user: Any, *, need: str = VIEW) -> QuerySet[Run]:
    """Return the runs ``user`` holds ``need`` on (their own, their projects', shared with them)."""
    if not _authenticated(user):
        return Run.objects.none()
    return Run.objects.filter(_run_q(user, need))


def visible_sweeps(user: Any, *, need: str = VIEW) -> QuerySet[Sweep]:
    """Return the sweeps ``user`` holds ``need`` on: their own and their projects' experiments'."""
    if not _authenticated(user):
        return Sweep.objects.none()
    return Sweep.objects.filter(Q(owner=user) | _experiment_q(user, need, prefix="experiment__"))


def _checked(queryset: QuerySet, held: QuerySet, pk: int, need: str, what: str) -> Any:
    """Return ``queryset``'s object ``pk``: 404 unless visible, 403 unless ``held`` has it."""
    if need not in NEED_RANK:
        raise ValueError(f"need={need!r}; one of {NEEDS}")
    found = queryset.filter(pk=pk).first()
    if found is None:
        raise Http404(f"No {what} #{pk} here.")
    if need != VIEW and not held.filter(pk=pk).exists():
        raise PermissionDenied(f"Your role on {what} #{pk} does not allow this ({need}).")
    return found


def run_for(user: Any, run_id: int, need: str = VIEW, queryset: QuerySet | None = None) -> Run:
    """Return run ``run_id`` for ``user``: Http404 without a view right, 403 without ``need``.

    ``queryset`` narrows or prefetches (it is filtered by the view right as well).
    """
    base = visible_runs(user).select_related("experiment", "external")
    if queryset is not None:
        base = queryset.filter(pk__in=visible_runs(user).values("pk"))
    return _checked(base, visible_runs(user, need=need), run_id, need, "run")


def experiment_for(
    user: Any, experiment_id: int, need: str = VIEW, queryset: QuerySet | None = None
) -> Experiment:
    """Return experiment ``experiment_id`` for ``user``: 404 without view, 403 without ``need``."""
    base = visible_experiments(user)
    if queryset is not None:
        base = queryset.filter(pk__in=base.values("pk"))
    return _checked(
        base,
        visible_experiments(user, need=need),
        experiment_id,
        need,
        "experiment",
    )


def experiment_to_sweep(
    user: Any, experiment_id: int, queryset: QuerySet | None = None
) -> Experiment:
    """Return ``user``'s own experiment ``experiment_id`` to start a sweep of.

    A sweep's members count against its experiment owner's quotas (``webapp.sweeps``), so a
    project's editor sweeps a clone of their own, not a member's experiment: 403.
    """
    experiment = experiment_for(user, experiment_id, EDIT, queryset=queryset)
    if experiment.owner_id != user.pk:
        raise PermissionDenied(
            f"A sweep runs on its experiment owner's quotas: clone experiment #{experiment_id} "
            "and sweep your copy."
        )
    return experiment


def sweep_for(user: Any, sweep_id: int, need: str = VIEW, queryset: QuerySet | None = None) -> Any:
    """Return sweep ``sweep_id`` for ``user``: 404 without view, 403 without ``need``."""
    base = visible_sweeps(user) if queryset is None else queryset
    base = base.filter(pk__in=visible_sweeps(user).values("pk"))
    return _checked(base, visible_sweeps(user, need=need), sweep_id, need, "sweep")


def external_run_for(user: Any, run_id: int) -> Any:
    """Return the ``ExternalRun`` of run ``run_id`` for its reporting client (``webapp.external``).

    Only the user who reports the run writes to it: 404 for a run ``user`` may not read (or a
    studio run), 403 for a project member's external run.
    """
    from webapp.external.models import ExternalRun

    run = run_for(user, run_id, VIEW)
    external = ExternalRun.objects.select_related("run__experiment").filter(run=run).first()
    if external is None:
        raise Http404(f"Run #{run_id} is not an external run.")
    if external.owner_id != user.pk:
        raise PermissionDenied(f"Only the client that reports run #{run_id} writes to it.")
    return external


def project_for(user: Any, project_id: int, need: str = VIEW) -> Project:
    """Return project ``project_id`` for ``user``: 404 unless a member, 403 without ``need``."""
    return _checked(
        visible_projects(user),
        Project.objects.filter(pk__in=project_ids(user, need=need)),
        project_id,
        need,
        "project",
    )


def visible_reports(user: Any, *, need: str = VIEW) -> QuerySet[Report]:
    """Return the reports ``user`` holds ``need`` on: their own, and their projects'.

    A project's viewer reads its reports, an editor also edits them, and the project's owner
    (as the report's owner) deletes them.
    """
    if not _authenticated(user):
        return Report.objects.none()
    return Report.objects.filter(Q(owner=user) | Q(project_id__in=project_ids(user, need=need)))


def report_for(user: Any, report_uuid: Any, need: str = VIEW) -> Report:
    """Return report ``report_uuid`` for ``user``: 404 without view, 403 without ``need``."""
    base = visible_reports(user).select_related("owner", "project")
    found = base.filter(uuid=report_uuid).first()
    if found is None:
        raise Http404("No such report here.")
    return _checked(base, visible_reports(user, need=need), found.pk, need, "report")


def report_may(user: Any, report: Report, need: str) -> bool:
    """Return whether ``user`` holds ``need`` on ``report`` (for showing or hiding buttons)."""
    return _authenticated(user) and visible_reports(user, need=need).filter(pk=report.pk).exists()


def run_may(user: Any, run: Run, need: str) -> bool:
    """Return whether ``user`` holds ``need`` on ``run`` (for showing or hiding buttons)."""
    return _authenticated(user) and visible_runs(user, need=need).filter(pk=run.pk).exists()


def experiment_may(user: Any, experiment: Experiment, need: str) -> bool:
    """Return whether ``user`` holds ``need`` on ``experiment``."""
    return (
        _authenticated(user)
        and visible_experiments(user, need=need).filter(pk=experiment.pk).exists()
    )


def run_reader_ids(run: Run) -> set[int]:
    """Return the ids of every user who may read ``run`` (as :func:`visible_runs` decides)."""
    ids = {run.owner_id}
    experiment = Experiment.objects.filter(pk=run.experiment_id).values("owner_id", "project_id")
    for row in experiment:
        ids.add(row["owner_id"])
        if row["project_id"] is not None:
            ids.update(
                Project.objects.filter(pk=row["project_id"]).values_list("owner_id", flat=True)
            )
            ids.update(
                Membership.objects.filter(project_id=row["project_id"]).values_list(
                    "user_id", flat=True
                )
            )
    ids.update(RunShareGrant.objects.filter(share__run_id=run.pk).values_list("user_id", flat=True))
    return ids


def run_visible_to(user: Any, run_id: int) -> Run | None:
    """Return run ``run_id`` if ``user`` may read it, else None (the sockets' check)."""
    if not _authenticated(user):
        return None
    return visible_runs(user).select_related("experiment", "external").filter(pk=run_id).first()


def access_changed(*, user_ids: Any = (), run_ids: Any = ()) -> None:
    """Tell the live sockets of ``user_ids`` and of ``run_ids`` to check their access again.

    Sent after the change commits; a channel layer that cannot be reached is logged, not
    raised (the change itself stands, and each socket checks again on the run's next status).
    """
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    from webapp.runs.models import run_group_name

    groups = [access_user_group(u) for u in user_ids] + [run_group_name(r) for r in run_ids]
    try:
        layer = get_channel_layer()
        for group in groups:
            async_to_sync(layer.group_send)(group, {"type": ACCESS_CHANGED})
    except Exception:
        logger.exception("could not tell the live sockets that their access changed")
