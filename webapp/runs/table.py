"""The runs table (``/runs/``): a member's runs across experiments, with chosen metric columns.

Everything the table shows comes from its query string, so a view is a shareable link:

- ``metric=<name>`` (repeated): a column pair per metric, its last recorded value and its best.
  Best is the maximum, or the minimum for names that read as costs (a loss, a KL, a timing);
  ``metric=<name>:min`` or ``:max`` says which.
- ``col=<dotted key>`` (repeated): a column of each run's config value of that key (any key of
  the engine's schema; ``actor_rollout_ref.actor.optim.lr``, ``actor_rollout_ref.rollout.n``,
  ``algorithm.adv_estimator``), written as the schema types it.
- ``sort=<column>`` (``-<column>`` descending): ``run``, ``status``, ``step``, ``created``,
  ``duration`` (started to finished, or to now while active), ``last:<name>`` or
  ``best:<name>`` of a chosen metric, ``config:<key>`` of a chosen config column. Runs without a
  value sort last.
- ``tag=<tag>`` (repeated: runs with every one; a run carries its own tags and its experiment's),
  ``status=<status>`` (repeated: any of them),
  ``config=<dotted key>=<value>`` (repeated: every one holds; the value is read as the schema
  types the key, so ``actor_rollout_ref.actor.optim.lr=1e-6`` matches a stored ``1e-06``).

A value that cannot be read is a :class:`RunTableQueryError` naming the parameter and the fix;
it carries the query without the bad parts, so the page keeps the columns and what was typed.
The chosen columns and sort are the member's own and persist between visits
(``RunTableChoice``, :func:`run_table_remember`): a visit whose link names no columns gets the
member's last ones.
The metric values come from one aggregate query over ``MetricPoint`` for the chosen names only
(per run and name: the last step with a value, min and max, then the value at that step),
whatever the number of runs: about 0.2 s for three columns over 50 runs of 1,000 steps of 50
metrics each, 0.65 s for twelve, on a shared 2-core machine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from operator import attrgetter
from typing import Any, TypeVar

from django.db import connection
from django.db.models import F, Func, Q, QuerySet
from django.http import QueryDict
from django.utils import timezone

from engine.config import ConfigFieldError
from engine.config.keys import coerce, resolve_key
from webapp.projects.access import visible_runs
from webapp.runs.models import MetricPoint, Run, RunStatus, RunTableChoice
from webapp.runs.numbers import metric_text
from webapp.runs.progress import format_duration
from webapp.runs.selectors import run_list_for_user

BASE_SORTS = {
    "run": ("experiment__name", "pk"),
    "status": ("status",),
    "step": ("latest_step",),
    "created": ("created_at",),
    "duration": (),
}
DEFAULT_SORT = "-created"
MAX_METRIC_COLUMNS = 12
MAX_CONFIG_COLUMNS = 8
# The parameters that choose the columns (what a member's visits keep), and all of them.
COLUMN_PARAMS = ("metric", "col", "sort")
# "group" is kept as given; the view groups the rows by it (webapp.runs.groups).
KNOWN_PARAMS = frozenset({"metric", "col", "sort", "tag", "status", "config", "group"})
MAX_ROWS = 500
# Name fragments of metrics where lower is better (the default direction of "best").
LOWER_IS_BETTER = ("loss", "kl", "timing", "grad_norm")


class RunTableQueryError(ValueError):
    """The table's query string cannot be read; ``errors`` says what to change, one per line,
    and ``query`` is what could be read (the columns, the typed filters, the good ones)."""

    def __init__(self, errors: list[str], query: RunTableQuery | None = None) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors
        self.query = query or RunTableQuery()


def lower_is_better(name: str) -> bool:
    """Return whether a metric's best value is its minimum (a loss, KL, grad norm or timing)."""
    return any(part in name.lower() for part in LOWER_IS_BETTER)


@dataclass(frozen=True)
class MetricColumn:
    name: str
    lower_is_better: bool

    @property
    def param(self) -> str:
        """Return the ``metric=`` value that asks for this column."""
        default = lower_is_better(self.name)
        if self.lower_is_better == default:
            return self.name
        return f"{self.name}:{'min' if self.lower_is_better else 'max'}"


@dataclass(frozen=True)
class ConfigColumn:
    key: str  # a dotted key of the engine's schema

    @property
    def label(self) -> str:
        """Return the key's last part, the column's short header (``lr``, ``n``)."""
        return self.key.rsplit(".", 1)[-1]


C = TypeVar("C", MetricColumn, ConfigColumn)


@dataclass(frozen=True)
class RunTableQuery:
    metrics: tuple[MetricColumn, ...] = ()
    columns: tuple[ConfigColumn, ...] = ()
    sort: str = "created"
    descending: bool = True
    tags: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()
    config: tuple[tuple[str, Any], ...] = ()  # (dotted key, value as the schema types it)
    config_params: tuple[str, ...] = ()  # the ``config=`` values as given
    group: str = ""  # "group by": seed, a dotted key, or "" for none

    @property
    def sort_param(self) -> str:
        return ("-" if self.descending else "") + self.sort


def _metric_column(value: str) -> MetricColumn:
    value = value.strip()
    name, _, direction = value.rpartition(":")
    if direction in ("min", "max") and name:
        return MetricColumn(name, direction == "min")
    return MetricColumn(value, lower_is_better(value))


def _config_filter(value: str) -> tuple[str, Any]:
    key, sep, raw = value.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(
            f"config={value!r} is not <dotted key>=<value>; "
            "e.g. config=actor_rollout_ref.actor.optim.lr=1e-6"
        )
    try:
        path = resolve_key(key)
    except ConfigFieldError as exc:
        raise ValueError(f"config={value!r}: {key!r} is {_unknown(exc)}") from None
    if not raw.strip():
        raise ValueError(
            f"config={value!r}: give {key} a value after '=', e.g. {key}={_example(path.type)} "
            "(null for an unset one)"
        )
    try:
        typed = coerce(raw.strip(), path.type, key) if raw.strip() != "null" else None
    except ConfigFieldError as exc:
        raise ValueError(f"config={value!r}: {exc.message}") from None
    return key, typed


def _unknown(exc: ConfigFieldError) -> str:
    """Return the schema's word on a key it does not know, without its ``=None``."""
    return exc.message.replace("unknown key", "not a config key", 1)


def _example(tp: Any) -> str:
    return {int: "4", float: "1e-6", bool: "true"}.get(tp, "<value>")


def _config_column(value: str) -> ConfigColumn:
    key = value.strip()
    try:
        resolve_key(key)
    except ConfigFieldError as exc:
        raise ValueError(f"col={value!r}: {key!r} is {_unknown(exc)}") from None
    return ConfigColumn(key)


def _read_columns(
    values: list[str],
    read: Callable[[str], C],
    name_of: Callable[[C], str],
    what: str,
    most: int,
    errors: list[str],
) -> dict[str, C]:
    """Return the columns ``values`` ask for by their name (the first of a repeated name), at
    most ``most``; add to ``errors`` each value ``read`` refuses, and a list that is too long."""
    columns: dict[str, C] = {}
    for value in values:
        if not value.strip():  # the column picker's empty "add" box
            continue
        try:
            column = read(value)
        except ValueError as exc:
            errors.append(str(exc))
            continue
        columns.setdefault(name_of(column), column)
    if len(columns) > most:
        errors.append(f"{len(columns)} {what} columns; pick at most {most}")
        columns = dict(list(columns.items())[:most])
    return columns


def parse_run_table_query(params: QueryDict) -> RunTableQuery:
    """Read the table's query string; RunTableQueryError lists every parameter it cannot read
    and carries the query made of the rest."""
    errors: list[str] = []
    unknown = sorted(set(params) - KNOWN_PARAMS)
    if unknown:
        errors.append(
            f"unknown parameter {', '.join(unknown)}; the table reads "
            f"{', '.join(sorted(KNOWN_PARAMS))}"
        )
    metrics = _read_columns(
        params.getlist("metric"),
        _metric_column,
        attrgetter("name"),
        "metric",
        MAX_METRIC_COLUMNS,
        errors,
    )
    columns = _read_columns(
        params.getlist("col"),
        _config_column,
        attrgetter("key"),
        "config",
        MAX_CONFIG_COLUMNS,
        errors,
    )
    statuses = tuple(dict.fromkeys(s for s in params.getlist("status") if s))
    bad = [s for s in statuses if s not in RunStatus.values]
    if bad:
        errors.append(f"status={bad[0]!r} is not a run status; use one of {', '.join(RunStatus)}")
        statuses = tuple(s for s in statuses if s not in bad)
    tags = tuple(dict.fromkeys(t.strip().lower() for t in params.getlist("tag") if t.strip()))
    config = []
    config_params = tuple(v for v in params.getlist("config") if v.strip())
    for value in config_params:
        try:
            config.append(_config_filter(value))
        except ValueError as exc:
            errors.append(str(exc))
    sort_param = params.get("sort", "").strip() or DEFAULT_SORT
    descending = sort_param.startswith("-")
    sort = sort_param.lstrip("-")
    kind, _, name = sort.partition(":")
    if not (
        sort in BASE_SORTS
        or (kind in ("last", "best") and name in metrics)
        or (kind == "config" and name in columns)
    ):
        choices = [
            *BASE_SORTS,
            *(f"last:{m}" for m in metrics),
            *(f"best:{m}" for m in metrics),
            *(f"config:{c}" for c in columns),
        ]
        errors.append(
            f"sort={sort_param!r} is not a column of this table; sort by one of "
            f"{', '.join(choices)} (prefix - for descending)"
        )
        sort, descending = DEFAULT_SORT.lstrip("-"), True
    query = RunTableQuery(
        metrics=tuple(metrics.values()),
        columns=tuple(columns.values()),
        sort=sort,
        descending=descending,
        tags=tags,
        statuses=statuses,
        config=tuple(config),
        config_params=config_params,
        group=params.get("group", "").strip(),
    )
    if errors:
        raise RunTableQueryError(errors, query)
    return query


def _nested(key: str, value: Any) -> dict[str, Any]:
    tree: Any = value
    for part in reversed(key.split(".")):
        tree = {part: tree}
    return tree


def run_table_runs(*, user: Any, query: RunTableQuery) -> QuerySet[Run]:
    """Return ``user``'s runs that pass the query's tag, status and config filters."""
    runs = run_list_for_user(user=user).defer("error", "experiment__config")
    if not query.columns:
        runs = runs.defer("config")
    for tag in query.tags:
        runs = runs.filter(Q(tags__contains=[tag]) | Q(experiment__tags__contains=[tag]))
    if query.statuses:
        runs = runs.filter(status__in=query.statuses)
    for key, value in query.config:
        runs = runs.filter(config__contains=_nested(key, value))
    return runs


@dataclass(frozen=True)
class MetricValues:
    last: float | None = None
    last_step: int | None = None
    best: float | None = None


def config_value(config: Any, key: str) -> tuple[bool, Any]:
    """Return ``(found, value)`` of a dotted key in a run's stored config."""
    node = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def config_text(found: bool, value: Any) -> str:
    """Return a config value as the table writes it: numbers as metrics are, ``null``, lists."""
    if not found:
        return "—"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return metric_text(value)
    if isinstance(value, list):
        return ", ".join(config_text(True, v) for v in value) or "[]"
    return str(value)


@dataclass
class RunRow:
    run: Run
    values: dict[str, MetricValues] = field(default_factory=dict)
    now: datetime | None = None

    @property
    def duration_s(self) -> float | None:
        """Return seconds from the run's start to its end (to now while it runs), or None."""
        run = self.run
        if run.started_at is None:
            return None
        end = run.finished_at or (self.now or timezone.now())
        return max(0.0, (end - run.started_at).total_seconds())

    @property
    def duration_text(self) -> str:
        return format_duration(self.duration_s)

    def config_cells(self, columns: tuple[ConfigColumn, ...]) -> list[str]:
        """Return the row's config values as text, in the order of ``columns``."""
        return [config_text(*config_value(self.run.config, c.key)) for c in columns]

    @property
    def tags(self) -> list[tuple[str, bool]]:
        """Return ``(tag, from the experiment)``: the run's own tags, then its experiment's."""
        own = list(self.run.tags)
        inherited = [t for t in self.run.experiment.tags if t not in own]
        return [(t, False) for t in own] + [(t, True) for t in inherited]

    def cells(self, metrics: tuple[MetricColumn, ...]) -> list[MetricValues]:
        """Return the row's values in the order of ``metrics`` (empty where none was recorded)."""
        return [self.values.get(m.name, MetricValues()) for m in metrics]


# One pass over the chosen runs' points reads each chosen value once (a JSON number, else NULL)
# and keeps per run and name the min, the max and the last step that has a value; the value at
# that step is then one index lookup per run and name. No sort, whatever the number of points.
_POINTS = MetricPoint._meta.db_table
_VALUE = (
    "CASE WHEN jsonb_typeof({t}.metrics -> %(k{i})s::text) = 'number' "
    "THEN ({t}.metrics -> %(k{i})s::text)::double precision END"
)


def metric_values_sql(count: int) -> str:
    """Return the aggregate query for ``count`` chosen names (``%(k0)s``... and ``%(runs)s``)."""
    keys = range(count)
    # OFFSET 0 keeps the planner from inlining j<i> into v<i>: each value is looked up once.
    raw = ", ".join(f"p.metrics -> %(k{i})s::text AS j{i}" for i in keys)
    columns = ", ".join(
        f"CASE WHEN jsonb_typeof(j{i}) = 'number' THEN j{i}::double precision END AS v{i}"
        for i in keys
    )
    aggregates = ", ".join(
        f"max(step) FILTER (WHERE v{i} IS NOT NULL) AS s{i}, min(v{i}) AS lo{i}, max(v{i}) AS hi{i}"
        for i in keys
    )
    lasts = ", ".join(
        f"agg.s{i}, (SELECT {_VALUE.format(t='q', i=i)} FROM {_POINTS} AS q "
        f"WHERE q.run_id = agg.run_id AND q.step = agg.s{i}), agg.lo{i}, agg.hi{i}"
        for i in keys
    )
    return (
        f"WITH raw AS (SELECT p.run_id, p.step, {raw} FROM {_POINTS} AS p "
        f"WHERE p.run_id = ANY(%(runs)s) OFFSET 0), "
        f"point AS (SELECT run_id, step, {columns} FROM raw), "
        f"agg AS (SELECT run_id, {aggregates} FROM point GROUP BY run_id) "
        f"SELECT agg.run_id, {lasts} FROM agg"
    )


def run_metric_values(
    *, run_ids: list[int], metrics: tuple[MetricColumn, ...]
) -> dict[int, dict[str, MetricValues]]:
    """Return ``{run id: {name: last, its step, best}}`` for the chosen metrics, in one query."""
    if not run_ids or not metrics:
        return {}
    params: dict[str, Any] = {f"k{i}": m.name for i, m in enumerate(metrics)}
    params["runs"] = run_ids
    out: dict[int, dict[str, MetricValues]] = {}
    with connection.cursor() as cursor:
        cursor.execute(metric_values_sql(len(metrics)), params)
        for run_id, *cells in cursor.fetchall():
            values = out.setdefault(run_id, {})
            for i, metric in enumerate(metrics):
                step, last, low, high = cells[4 * i : 4 * i + 4]
                if step is not None:
                    best = low if metric.lower_is_better else high
                    values[metric.name] = MetricValues(last, step, best)
    return out


def run_table_metric_names(*, user: Any) -> list[str]:
    """Return every metric name ``user``'s runs recorded, sorted (the column picker's choices)."""
    keys = (
        MetricPoint.objects.filter(run__in=visible_runs(user).values("pk"))
        .annotate(key=Func(F("metrics"), function="jsonb_object_keys"))
        .order_by()
        .values_list("key", flat=True)
        .distinct()
    )
    return sorted(keys)


def run_table_config_keys(*, user: Any) -> list[str]:
    """Return the dotted keys of ``user``'s newest run's config (the column picker's choices)."""
    from webapp.runs.selectors import flatten_config

    config = (visible_runs(user).order_by("-created_at").values_list("config", flat=True)).first()
    return sorted(k for k in flatten_config(config or {}) if k)


def run_table_tags(*, user: Any) -> list[str]:
    """Return every tag on ``user``'s runs and on the experiments they ran, sorted."""
    runs = visible_runs(user).order_by()
    own = runs.annotate(tag=Func(F("tags"), function="unnest")).values_list("tag", flat=True)
    inherited = runs.annotate(tag=Func(F("experiment__tags"), function="unnest")).values_list(
        "tag", flat=True
    )
    return sorted(own.union(inherited))


def _sort_key(row: RunRow, query: RunTableQuery) -> tuple:
    kind, _, name = query.sort.partition(":")
    if query.sort == "duration":
        duration = row.duration_s
        return (duration is None, (duration,) if duration is not None else ())
    if kind == "config":
        found, value = config_value(row.run.config, name)
        if not found or value is None:
            return (True, ())
        # Numbers before text, each in its own order; a list or a mapping by its text.
        number = isinstance(value, int | float) and not isinstance(value, bool)
        return (False, (0, value, "") if number else (1, 0, str(value)))
    if query.sort in BASE_SORTS:
        run = row.run
        values = {
            "run": (run.experiment.name.lower(), run.pk),
            "status": (run.status,),
            "step": (run.latest_step,),
            "created": (run.created_at,),
        }[query.sort]
        return (False, values)
    cell = row.values.get(name, MetricValues())
    value = cell.last if kind == "last" else cell.best
    return (value is None, (value,) if value is not None else ())


def run_table(*, user: Any, query: RunTableQuery) -> tuple[list[RunRow], int]:
    """Return the table's rows (sorted, at most ``MAX_ROWS``) and how many runs passed the filters.

    Two queries whatever the number of runs: the runs, then their values of the chosen metrics.
    """
    runs = list(run_table_runs(user=user, query=query))
    values = run_metric_values(run_ids=[r.pk for r in runs], metrics=query.metrics)
    now = timezone.now()
    rows = [RunRow(run, values.get(run.pk, {}), now) for run in runs]
    # Two stable sorts: by the newest first, then by the column (runs without a value last).
    rows.sort(key=lambda row: row.run.pk, reverse=True)
    present = [r for r in rows if not _sort_key(r, query)[0]]
    missing = [r for r in rows if _sort_key(r, query)[0]]
    present.sort(key=lambda row: _sort_key(row, query)[1], reverse=query.descending)
    rows = present + missing
    return rows[:MAX_ROWS], len(runs)


def run_table_column_params(query: RunTableQuery) -> dict[str, list[str]]:
    """Return the parameters of the query's columns and sort: what a member's visits keep."""
    return {
        "metric": [m.param for m in query.metrics],
        "col": [c.key for c in query.columns],
        "sort": [query.sort_param],
    }


def run_table_remembered(*, user: Any) -> dict[str, list[str]] | None:
    """Return the columns and sort ``user`` chose last, or None before their first choice."""
    choice = RunTableChoice.objects.filter(owner=user).first()
    return choice.params if choice is not None else None


def run_table_remember(*, user: Any, query: RunTableQuery) -> None:
    """Keep the query's columns and sort as ``user``'s own for their next visits."""
    RunTableChoice.objects.bulk_create(
        [RunTableChoice(owner=user, params=run_table_column_params(query))],
        update_conflicts=True,
        unique_fields=["owner"],
        update_fields=["params", "updated_at"],
    )


def run_table_forget(*, user: Any) -> None:
    """Drop ``user``'s kept columns: the table opens with its defaults again."""
    RunTableChoice.objects.filter(owner=user).delete()
