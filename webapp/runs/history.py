"""A resumed run's history: its ancestors' steps up to each resume point, then its own steps.

A run that resumes from ``global_step_N`` of its parent records steps ``N + 1, N + 2, ...``; the
parent may have recorded steps after ``N`` before it stopped (it saved every ten steps and died at
step 17, say). Those steps are superseded: the child recomputes them from the checkpoint. So a
chain reads as one history by taking, from each run, the steps after the point it resumed from
and up to the point its child resumed from. The charts, the exports, the live backlog and the
comparison all read metrics through these segments, so no step is shown twice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.db.models import Q

from webapp.runs.models import Run

_CHECKPOINT_STEP = re.compile(r"global_step_(\d+)/*$")
# A chain longer than this is a data error (a cycle written by hand); stop walking there.
MAX_CHAIN = 10_000


@dataclass(frozen=True)
class Segment:
    """The steps of one run that belong to a history: ``after < step <= upto`` (None: unbounded)."""

    run_id: int
    after: int | None
    upto: int | None


def resume_step(run: Run) -> int | None:
    """Return the step a resumed run continues after, or None for a run that starts afresh.

    Once the driver started, the run's ``start_step`` says it; before that, the checkpoint
    folder the run was queued with (``.../global_step_N``) does.
    """
    if run.parent_id is None:
        return None
    if run.started_at is not None:
        return run.start_step
    path = str(((run.config or {}).get("trainer") or {}).get("resume_from_path") or "")
    match = _CHECKPOINT_STEP.search(path)
    return int(match.group(1)) if match else run.start_step


def run_history(*, run_id: int) -> list[Segment]:
    """Return the segments of ``run_id``'s history, the oldest ancestor first."""
    rows = {}
    segments: list[Segment] = []
    upto: int | None = None
    current: int | None = run_id
    while current is not None and len(segments) < MAX_CHAIN and current not in rows:
        run = Run.objects.only("id", "parent_id", "started_at", "start_step", "config").get(
            pk=current
        )
        rows[current] = run
        after = resume_step(run)
        segments.append(Segment(run.pk, after, upto))
        upto, current = after, run.parent_id
    return segments[::-1]


def history_where(
    segments: list[Segment], step_min: int | None = None, step_max: int | None = None
) -> tuple[str, list[int]]:
    """Return a SQL condition on ``run_id`` and ``step`` selecting the history, and its params."""
    clauses, params = [], []
    for segment in segments:
        parts = ["run_id = %s"]
        params.append(segment.run_id)
        for op, bound in (
            (">", segment.after),
            ("<=", segment.upto),
            (">=", step_min),
            ("<=", step_max),
        ):
            if bound is not None:
                parts.append(f"step {op} %s")
                params.append(bound)
        clauses.append("(" + " AND ".join(parts) + ")")
    return "(" + " OR ".join(clauses) + ")", params


def history_q(segments: list[Segment], step_min: int | None = None) -> Q:
    """Return the ORM filter selecting the history's rows (of any model with ``run`` and ``step``)."""
    selected = Q(pk__in=[])
    for segment in segments:
        bounds = {"run_id": segment.run_id}
        if segment.after is not None:
            bounds["step__gt"] = segment.after
        if segment.upto is not None:
            bounds["step__lte"] = segment.upto
        if step_min is not None:
            bounds["step__gte"] = step_min
        selected |= Q(**bounds)
    return selected
