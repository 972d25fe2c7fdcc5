"""Reads of a report, for one reader: the runs and groups they may read, the charts' series, the
sample table and the rendered notes; the page and the exported file draw the same payload.

A report never widens access: each of its runs is shown only if the reader may read it
(``webapp.projects.access.visible_runs``), and each group is formed among the runs the reader
may read (``webapp.runs.groups.run_group_for_user``), so a group shows the members the reader
sees. What is left out is counted, and the page says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db.models import QuerySet
from django.utils.safestring import SafeString

from webapp.projects.access import VIEW, visible_reports
from webapp.reports.models import Report
from webapp.reports.notes import render_notes
from webapp.runs.bands import GROUP_MAX_POINTS, group_metric_series
from webapp.runs.groups import GROUP_MAX_MEMBERS, GroupByError, RunGroup, run_group_for_user
from webapp.runs.metrics import DEFAULT_MAX_POINTS, run_metric_series
from webapp.runs.models import Run, Sample, SampleSplit
from webapp.runs.selectors import run_list_for_user

# The table cuts long texts; the inspector shows them whole.
PROMPT_CHARS = 400
RESPONSE_CHARS = 800


@dataclass
class SampleRow:
    run_label: str
    run_id: int
    step: int
    rank: str  # "best" or "worst"
    reward: float
    prompt: str
    response: str


@dataclass
class ReportView:
    """What one reader sees of a report."""

    report: Report
    runs: list[Run]
    groups: list[RunGroup]
    hidden_runs: int
    hidden_groups: int
    notes_html: SafeString
    charts: dict[str, Any]
    samples: list[SampleRow] = field(default_factory=list)

    @property
    def hidden(self) -> int:
        return self.hidden_runs + self.hidden_groups


def report_list_for_user(*, user: Any) -> QuerySet[Report]:
    """Return the reports ``user`` may read, newest change first."""
    return visible_reports(user, need=VIEW).select_related("owner", "project")


def run_label(run: Run) -> str:
    return f"{run.experiment.name} · run #{run.pk}"


def _groups(user: Any, tokens: list[str]) -> tuple[list[RunGroup], int]:
    found, hidden = [], 0
    for token in tokens:
        try:
            found.append(run_group_for_user(user=user, token=token))
        except (GroupByError, Run.DoesNotExist):
            hidden += 1  # gone, or formed of runs this reader may not read
    return found, hidden


def report_charts(*, report: Report, runs: list[Run], groups: list[RunGroup]) -> dict[str, Any]:
    """Return the charts' payload: the metric names and, for each run and group, its series.

    A run's series are its min/max-downsampled points (``run_metric_series``); a group's, its
    band (``group_metric_series``: mean, min, max, std, n), as the compare page draws them.
    """
    names = list(report.metrics)
    sources: list[dict[str, Any]] = []
    for run in runs:
        result = run_metric_series(run_id=run.pk, names=names, max_points=DEFAULT_MAX_POINTS)
        sources.append({"label": run_label(run), "band": False, "series": result["series"]})
    for group in groups:
        result = group_metric_series(
            run_ids=group.run_ids[:GROUP_MAX_MEMBERS], names=names, max_points=GROUP_MAX_POINTS
        )
        sources.append(
            {
                "label": group.label,
                "band": True,
                "members": group.members_text,
                "series": result["series"],
            }
        )
    return {"metrics": names, "sources": sources}


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def report_samples(*, report: Report, runs: list[Run]) -> list[SampleRow]:
    """Return the best and worst ``report.sample_count`` train samples of each run by reward,
    at ``report.sample_step`` or, when it is empty, at each run's latest step with samples."""
    rows: list[SampleRow] = []
    count = report.sample_count
    if not count:
        return rows
    for run in runs:
        samples = Sample.objects.filter(run=run, split=SampleSplit.TRAIN).exclude(
            reward=float("nan")
        )
        step = report.sample_step
        if step is None:
            step = samples.order_by("-step").values_list("step", flat=True).first()
            if step is None:
                continue
        at_step = samples.filter(step=step).only("reward", "prompt_text", "response_text", "step")
        best = list(at_step.order_by("-reward", "prompt_index", "sample_index")[:count])
        seen = {sample.pk for sample in best}
        worst = [
            s
            for s in at_step.order_by("reward", "prompt_index", "sample_index")[:count]
            if s.pk not in seen
        ]
        for rank, chosen in (("best", best), ("worst", list(reversed(worst)))):
            rows.extend(
                SampleRow(
                    run_label=run_label(run),
                    run_id=run.pk,
                    step=sample.step,
                    rank=rank,
                    reward=sample.reward,
                    prompt=_cut(sample.prompt_text, PROMPT_CHARS),
                    response=_cut(sample.response_text, RESPONSE_CHARS),
                )
                for sample in chosen
            )
    return rows


def report_view(*, report: Report, user: Any) -> ReportView:
    """Return what ``user`` (who may read ``report``: checked by the caller) sees of it."""
    wanted = [int(pk) for pk in report.run_ids]
    readable = {run.pk: run for run in run_list_for_user(user=user).filter(pk__in=wanted)}
    runs = [readable[pk] for pk in wanted if pk in readable]
    groups, hidden_groups = _groups(user, list(report.group_tokens))
    return ReportView(
        report=report,
        runs=runs,
        groups=groups,
        hidden_runs=len(wanted) - len(runs),
        hidden_groups=hidden_groups,
        notes_html=render_notes(report.notes),
        charts=report_charts(report=report, runs=runs, groups=groups),
        samples=report_samples(report=report, runs=runs),
    )
