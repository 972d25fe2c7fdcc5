"""Writes on reports: create one (from the compare page or the reports list), edit, delete.

A report names the runs and groups it draws; its author must be able to read each of them when
saving (a report never names what its author could not see), and a report filed in a project
needs its author to be the project's owner or one of its editors. Readers see only what they may
read themselves (``webapp.reports.selectors``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from webapp.projects.access import EDIT, project_ids, visible_runs
from webapp.projects.models import Project
from webapp.reports.models import Report
from webapp.runs.groups import GroupByError, run_groups_by_token
from webapp.runs.models import Run

MAX_TITLE = 200
MAX_NOTES = 100_000
# As the compare page: more runs and groups than this make an unreadable overlay.
MAX_SOURCES = 8
MAX_METRICS = 12
MAX_SAMPLE_COUNT = 20
MAX_STEP = 2**31 - 1  # a PositiveIntegerField's ceiling in PostgreSQL
DEFAULT_METRICS = ("critic/score/mean",)
_METRIC = re.compile(r"[\w./@:%+-]{1,200}")


class ReportError(ValueError):
    """A report that cannot be saved as asked, with the reason the member can act on."""


def _title(title: str) -> str:
    title = title.strip()
    if not title or len(title) > MAX_TITLE:
        raise ReportError(f"a report needs a title of 1 to {MAX_TITLE} characters")
    return title


def _notes(notes: str) -> str:
    if len(notes) > MAX_NOTES:
        raise ReportError(f"the notes are {len(notes):,} characters; keep them under {MAX_NOTES:,}")
    return notes


def parse_metrics(text: str) -> list[str]:
    """Return the metric names in ``text`` (one per line or comma-separated), in order, once."""
    names = list(dict.fromkeys(part.strip() for part in re.split(r"[,\n]", text) if part.strip()))
    bad = [name for name in names if not _METRIC.fullmatch(name)]
    if bad:
        raise ReportError(f"{bad[0][:80]!r} is not a metric name, such as critic/score/mean")
    if len(names) > MAX_METRICS:
        raise ReportError(f"{len(names)} metrics; a report charts at most {MAX_METRICS}")
    return names


def _sample_count(value: int) -> int:
    if not 0 <= value <= MAX_SAMPLE_COUNT:
        raise ReportError(f"samples={value}: show 0 to {MAX_SAMPLE_COUNT} best and worst samples")
    return value


def _project(owner: Any, project: Project | None) -> Project | None:
    if (
        project is not None
        and not Project.objects.filter(pk=project.pk, pk__in=project_ids(owner, need=EDIT)).exists()
    ):
        raise ReportError("file reports only in projects where you are an editor or the owner")
    return project


def _sources(owner: Any, run_ids: Sequence[int], group_tokens: Sequence[str]) -> None:
    if not run_ids and not group_tokens:
        raise ReportError("pick at least one run or group for the report")
    if len(run_ids) + len(group_tokens) > MAX_SOURCES:
        raise ReportError(f"a report draws at most {MAX_SOURCES} runs and groups")
    if visible_runs(owner).filter(pk__in=run_ids).count() != len(run_ids):
        raise ReportError("pick runs you may read")
    try:
        run_groups_by_token(user=owner, tokens=group_tokens)
    except (GroupByError, Run.DoesNotExist):
        raise ReportError("pick groups among the runs you may read") from None


def report_create(
    *,
    owner: Any,
    title: str,
    run_ids: Sequence[int] = (),
    group_tokens: Sequence[str] = (),
    project: Project | None = None,
    notes: str = "",
    metrics: Sequence[str] = DEFAULT_METRICS,
) -> Report:
    """Save ``owner``'s report of ``run_ids`` and ``group_tokens`` (ReportError if it cannot be)."""
    run_ids = list(dict.fromkeys(run_ids))
    group_tokens = list(dict.fromkeys(group_tokens))
    _sources(owner, run_ids, group_tokens)
    return Report.objects.create(
        owner=owner,
        project=_project(owner, project),
        title=_title(title),
        notes=_notes(notes),
        run_ids=run_ids,
        group_tokens=group_tokens,
        metrics=parse_metrics(",".join(metrics)) or list(DEFAULT_METRICS),
    )


def report_update(
    *,
    report: Report,
    title: str,
    notes: str,
    metrics: str,
    sample_count: int,
    sample_step: int | None,
) -> Report:
    """Change a report's title, notes, charted metrics and sample table (the caller checked
    that the editor may: ``webapp.projects.access.report_for`` with ``EDIT``)."""
    report.title = _title(title)
    report.notes = _notes(notes)
    report.metrics = parse_metrics(metrics) or list(DEFAULT_METRICS)
    report.sample_count = _sample_count(sample_count)
    if sample_step is not None and not 0 <= sample_step <= MAX_STEP:
        raise ReportError(f"step={sample_step}: give a step from 0 to {MAX_STEP:,}, or none")
    report.sample_step = sample_step
    report.save()
    return report


def report_delete(*, report: Report) -> None:
    """Delete a report (the caller checked the right: its owner or its project's owner)."""
    report.delete()
