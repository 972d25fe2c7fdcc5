"""Read queries on sweeps: a user's sweeps with their status, and each member's headline metrics.

:func:`sweep_state` is what the sweep page shows of a sweep that moves (its status, each member's
status, progress and headline metrics, the parallel-coordinates figure): the page's first paint
embeds it and its script reads it again whenever a member's socket reports a status or a step,
so the page follows its members as the run page follows its run.

The headline metrics are the reward mean (``critic/score/mean``: the reward function's score,
before any KL penalty) and the validation score: the mean over data sources of verl's
``val-core/<source>/<var>/mean@<n>`` (``engine.trainer.metrics.validation_metric_names``). Each
is reported at its last recorded step (final) and at its best step (the highest value).

A sweep with an objective (a ``tpe`` sweep, or one with a pruner) also reads every member's
recorded values of its objective metric (:func:`member_histories`): what the search and the
pruner decide from, and the best member so far.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import (
    Case,
    Count,
    Exists,
    FloatField,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Value,
    When,
)
from django.db.models.fields.json import KT, KeyTextTransform
from django.db.models.functions import Cast

from webapp.projects.access import visible_sweeps
from webapp.runs.models import ACTIVE_STATUSES, MetricPoint, Run, RunStatus
from webapp.runs.numbers import metric_text
from webapp.runs.progress import run_progress_of
from webapp.sweeps.models import Sweep, SweepMember, SweepStatus
from webapp.sweeps.spec import PRUNERS
from webapp.sweeps.trials import COMPLETE, FAILED, PRUNED, RUNNING, MemberHistory

REWARD_METRIC = "critic/score/mean"
VALIDATION_PATTERN = r"^val-core/.+/mean@[0-9]+$"


def sweep_list_for_user(*, user: Any) -> QuerySet[Sweep]:
    """Return the sweeps ``user`` may read, newest first, with ``status`` and ``member_count``
    annotated.

    A tpe sweep with members still to draw is running (unless its search stopped).
    """
    active = Run.objects.filter(sweep_member__sweep=OuterRef("pk"), status__in=ACTIVE_STATUSES)
    to_draw = Q(
        spec__mode="tpe",
        stop_reason="",
        member_count__lt=Cast(KT("spec__count"), IntegerField()),
    )
    return (
        visible_sweeps(user)
        .select_related("experiment")
        .annotate(
            member_count=Count("members"),
            active_count=Count("members", filter=Q(members__run__status__in=ACTIVE_STATUSES)),
        )
        .annotate(
            status=Case(
                When(cancelled_at__isnull=False, then=Value(str(SweepStatus.CANCELLED))),
                When(Exists(active), then=Value(str(SweepStatus.RUNNING))),
                When(to_draw, then=Value(str(SweepStatus.RUNNING))),
                default=Value(str(SweepStatus.FINISHED)),
            ),
        )
    )


def _member_state(member: SweepMember) -> str:
    if member.pruned is not None:
        return PRUNED
    if member.run.status in ACTIVE_STATUSES:
        return RUNNING
    return COMPLETE if member.run.status == RunStatus.SUCCEEDED else FAILED


def member_histories(*, sweep: Sweep) -> list[MemberHistory]:
    """Return what the search and the pruner know of each member, in member order.

    Its values, its state (a member the pruner stopped is pruned, whatever its run's end) and
    every finite value of the sweep's objective metric its run recorded, by step; a pruned
    member's up to the step it was pruned at. Empty scores for a sweep with no objective.
    """
    members = list(sweep.members.select_related("run").order_by("index"))
    scores: dict[int, dict[int, float]] = defaultdict(dict)
    objective = sweep.spec.get("objective")
    if objective is not None and members:
        metric = objective["metric"]
        rows = (
            MetricPoint.objects.filter(
                run_id__in=[m.run_id for m in members], metrics__has_key=metric
            )
            .annotate(score=Cast(KeyTextTransform(metric, "metrics"), FloatField()))
            .values_list("run_id", "step", "score")
        )
        for run_id, step, score in rows:
            if score is not None and math.isfinite(score):
                scores[run_id][step] = score
    out = []
    for m in members:
        mine = scores[m.run_id]
        if m.pruned is not None:
            mine = {step: v for step, v in mine.items() if step <= m.pruned["step"]}
        out.append(
            MemberHistory(
                index=m.index,
                values=m.values,
                state=_member_state(m),
                scores=mine,
                pruned_rung=(m.pruned or {}).get("rung"),
            )
        )
    return out


def best_member(*, sweep: Sweep, histories: list[MemberHistory]) -> MemberHistory | None:
    """Return the finished member with the best final objective value so far, or None."""
    objective = sweep.spec.get("objective")
    done = [h for h in histories if h.state == COMPLETE and h.final is not None]
    if objective is None or not done:
        return None
    pick = min if objective["direction"] == "minimize" else max
    return pick(done, key=lambda h: h.final)  # type: ignore[arg-type,return-value]


def strategy_text(spec: dict[str, Any]) -> str:
    """Return how the sweep searches and stops, e.g. ``tpe, 16 members, seed 0; median pruner``."""
    mode = spec["mode"]
    parts = [{"grid": "grid", "random": "random", "tpe": "Bayesian (Optuna TPE)"}.get(mode, mode)]
    if mode != "grid":
        parts.append(f"{spec['count']} members, seed {spec['seed']}")
    if mode == "tpe":
        parts.append(f"{spec['n_startup_trials']} random before TPE models the scores")
    text = ", ".join(parts)
    objective = spec.get("objective")
    if objective is not None:
        text += f"; {objective['direction']} {objective['metric']}"
    pruner = spec.get("pruner")
    if pruner is not None:
        names = PRUNERS.get(pruner["type"], {})  # jsonb keeps no key order: the spec's
        settings = ", ".join(f"{k}={pruner[k]}" for k in names if k in pruner)
        text += f"; {pruner['type'].replace('_', '-')} pruner ({settings})"
    return text


@dataclass
class Headline:
    """A metric's value at the member's last step that recorded it, and its best value."""

    final: float | None = None
    best: float | None = None
    step: int | None = None  # the step of ``final``

    def take(self, step: int, value: float | None) -> None:
        if value is None or not math.isfinite(value):
            return
        self.final, self.step = value, step
        self.best = value if self.best is None else max(self.best, value)


@dataclass
class MemberRow:
    member: SweepMember
    run: Run
    values: list[Any]  # in the order of the sweep's keys
    values_text: list[str]
    reward: Headline
    validation: Headline


def _headlines(run_ids: list[int]) -> dict[int, tuple[Headline, Headline]]:
    """Return (reward, validation) headlines per run, read step by step in one query."""
    table = MetricPoint._meta.db_table
    out: dict[int, tuple[Headline, Headline]] = defaultdict(lambda: (Headline(), Headline()))
    if not run_ids:
        return out
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT run_id, step,
              CASE WHEN jsonb_typeof(metrics -> %s) = 'number'
                   THEN (metrics ->> %s)::float8 END,
              (SELECT avg((value #>> '{{}}')::float8) FROM jsonb_each(metrics)
               WHERE key ~ %s AND jsonb_typeof(value) = 'number')
            FROM {table} WHERE run_id = ANY(%s) ORDER BY run_id, step
            """,  # noqa: S608 - the table name is the model's, the values are parameters
            [REWARD_METRIC, REWARD_METRIC, VALIDATION_PATTERN, run_ids],
        )
        for run_id, step, reward, validation in cursor.fetchall():
            row = out[run_id]
            row[0].take(step, reward)
            row[1].take(step, validation)
    return out


def sweep_keys(sweep: Sweep) -> list[str]:
    """Return the swept config keys in the spec's order."""
    return list(sweep.keys)


def value_text(value: Any) -> str:
    """Return a swept value for a table: floats to 4 significant digits (``3e-06``)."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return "null" if value is None else str(value)


def sweep_member_rows(*, sweep: Sweep) -> list[MemberRow]:
    """Return each member with its run, swept values and headline metrics, in member order."""
    members = list(sweep.members.select_related("run", "run__experiment").order_by("index"))
    headlines = _headlines([m.run_id for m in members])
    keys = sweep_keys(sweep)
    return [
        MemberRow(
            member=m,
            run=m.run,
            values=[m.values.get(key) for key in keys],
            values_text=[value_text(m.values.get(key)) for key in keys],
            reward=headlines[m.run_id][0],
            validation=headlines[m.run_id][1],
        )
        for m in members
    ]


# Numbers spread over this many times their smallest are drawn on a log axis (a learning rate).
LOG_AXIS_RATIO = 100


def parcoords_dimension(label: str, values: list[Any]) -> dict[str, Any]:
    """Return a Plotly parcoords dimension; text and booleans become ticks of their own.

    Parallel coordinates have no log axis, so positive numbers spanning ``LOG_AXIS_RATIO`` or
    more are drawn as their ``log10``, ticked at each power of ten.
    """
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        if values and min(values) > 0 and max(values) >= LOG_AXIS_RATIO * min(values):
            logs = [math.log10(v) for v in values]
            decades = list(range(math.floor(min(logs)), math.ceil(max(logs)) + 1))
            return {
                "label": f"{label} (log)",
                "values": logs,
                "tickvals": decades,
                "ticktext": [f"1e{d}" for d in decades],
            }
        return {"label": label, "values": values}
    names = sorted({str(v) for v in values})
    return {
        "label": label,
        "values": [names.index(str(v)) for v in values],
        "tickvals": list(range(len(names))),
        "ticktext": names,
    }


def sweep_parallel_coordinates(*, sweep: Sweep, rows: list[MemberRow]) -> dict[str, Any]:
    """Return the parallel-coordinates figure: swept values -> final reward (and validation).

    Only members with a final reward are lines; ``members`` lists their indexes.
    """
    done = [row for row in rows if row.reward.final is not None]
    dimensions = [
        parcoords_dimension(key, [row.values[i] for row in done])
        for i, key in enumerate(sweep_keys(sweep))
    ]
    final = [row.reward.final for row in done]
    dimensions.append({"label": f"final {REWARD_METRIC}", "values": final})
    if done and all(row.validation.final is not None for row in done):
        dimensions.append(
            {"label": "final validation score", "values": [row.validation.final for row in done]}
        )
    return {
        "members": [row.member.index for row in done],
        "data": [
            {
                "type": "parcoords",
                "dimensions": dimensions,
                "line": {"color": final, "colorscale": "Viridis", "showscale": True},
            }
        ],
    }


def sweep_state(*, sweep: Sweep, rows: list[MemberRow] | None = None) -> dict[str, Any]:
    """Return the sweep page's live part: the sweep's status and every member's, in order.

    ``sweep`` comes from :func:`sweep_list_for_user` (its ``status`` and ``active_count`` are
    annotations); ``rows`` are its :func:`sweep_member_rows` when the caller has them. Each
    headline comes as its value and its text (``webapp.runs.numbers.metric_text``).
    """
    rows = sweep_member_rows(sweep=sweep) if rows is None else rows

    def headline(value: float | None) -> dict[str, Any]:
        return {"value": value, "text": metric_text(value)}

    histories = member_histories(sweep=sweep) if "objective" in sweep.spec else []
    best = best_member(sweep=sweep, histories=histories)
    finals = {h.index: h.final for h in histories}
    best_run = None if best is None else next(r.run for r in rows if r.member.index == best.index)
    return {
        "id": sweep.pk,
        "status": sweep.status,
        "active_count": sweep.active_count,
        "strategy": strategy_text(sweep.spec),
        "stop_reason": sweep.stop_reason,
        "objective": sweep.spec.get("objective"),
        "best": None
        if best is None or best_run is None
        else {
            "index": best.index,
            "run_id": best_run.pk,
            "url": best_run.get_absolute_url(),
            "value": headline(best.final),
            "values": best.values,
        },
        "members": [
            {
                "index": row.member.index,
                "run_id": row.run.pk,
                "status": row.run.status,
                "progress": run_progress_of(row.run).as_dict(),
                "reward_final": headline(row.reward.final),
                "reward_best": headline(row.reward.best),
                "validation_final": headline(row.validation.final),
                "validation_best": headline(row.validation.best),
                "objective_final": headline(finals.get(row.member.index)),
                "pruned": row.member.pruned,
            }
            for row in rows
        ],
        "parcoords": sweep_parallel_coordinates(sweep=sweep, rows=rows),
    }
