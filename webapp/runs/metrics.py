"""Metric series for the live charts and the exports: min/max buckets, zoom refinement, CSV/JSON.

A 20,000-step run records 20,000 values per metric; a chart needs about as many points as it has
pixels. Each series is cut into equal buckets of consecutive points and keeps each bucket's minimum
and maximum (plus the first and last point), so a spike survives downsampling where an average
would hide it (the M4 idea of Jugel et al., VLDB 2014, with two of its four points). Every kept
point is a value the run recorded at the step it recorded it, so the charts, the refined views and
the exports all show the same numbers; the exports simply keep every step.

Zooming refines: the chart asks for the step range it shows and gets that range downsampled to the
same budget, so a 200-step window shows all 200 points.

Panels come from the metric names present: verl's well-known families get their own panel, and
any other name lands in a panel of its own family (``critic/values/mean``, ``/max`` and ``/min``
share ``critic/values``), so a new metric shows without code.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
from django.db import DataError, connection, transaction
from django.db.models import F, Func

from webapp.runs.history import Segment, history_q, history_where, run_history
from webapp.runs.models import MetricPoint
from webapp.spreadsheet import spreadsheet_text

DEFAULT_MAX_POINTS = 1500
MAX_POINTS_LIMIT = 20_000

# The score panel is drawn first; the live socket sends these series before the rest.
HEADLINE_METRICS = (
    "critic/score/mean",
    "critic/score/max",
    "critic/score/min",
    "critic/rewards/mean",
    "critic/rewards/max",
    "critic/rewards/min",
)

# (key, title, pattern) in page order; the first pattern a name matches picks its panel.
PANEL_RULES: tuple[tuple[str, str, re.Pattern[str]], ...] = tuple(
    (key, title, re.compile(pattern))
    for key, title, pattern in (
        ("score", "Score / reward", r"^critic/(score|rewards)/"),
        (
            "kl",
            "KL (loss and coefficient)",
            r"^actor/(kl_loss|kl_coef|ppo_kl|reward_kl_penalty\w*)$",
        ),
        ("policy_loss", "Policy loss", r"^actor/pg_loss$"),
        ("value_loss", "Value loss", r"^critic/vf_loss$"),
        ("entropy", "Entropy", r"^actor/entropy$"),
        ("clip_fraction", "Clip fraction", r"clipfrac"),
        ("grad_norm", "Grad norm", r"/grad_norm$"),
        ("response_length", "Response length", r"^response_length/"),
        ("validation", "Validation reward", r"^val-(core|aux)/"),
        ("throughput", "Throughput (tokens/s per device)", r"^perf/throughput$"),
        ("mfu", "MFU (model FLOPs / device peak)", r"^perf/mfu/"),
        (
            "memory",
            "Memory (GiB)",
            r"^perf/(driver/rss_gb|max_rss_gb|max_memory_\w+_gb|cpu_memory_used_gb"
            r"|min_memory_available_gb)$",
        ),
        ("cpu", "CPU (% of one core)", r"^perf/(driver/cpu_percent|max_cpu_percent)$"),
        # Asynchronous training (one-step-off, fully-async): the trainers' ``async/`` metrics
        # and the rollout worker's own timings.
        (
            "async_staleness",
            "Async · staleness (updates behind the actor)",
            r"^async/(staleness_\w+|max_allowed_staleness)$",
        ),
        ("async_queue", "Async · rollout queue (samples waiting)", r"^async/queue_size$"),
        (
            "async_dropped",
            "Async · samples dropped as stale",
            r"^async/dropped_stale_samples(_total)?$",
        ),
        ("async_version", "Async · rollout policy version", r"^async/rollout_policy_version$"),
        (
            "async_resumed",
            "Async · samples finished by newer weights, or generated again after a resume",
            r"^async/(partial_rollout_samples|regenerated_after_resume)$",
        ),
        (
            "async_utilisation",
            "Async · busy share of the step (rollout, trainer)",
            r"^async/\w+_utilisation$",
        ),
        (
            "async_time",
            "Async · rollout vs training time (s)",
            r"^timing_s/(rollout_worker_gen\w*|sync_rollout_weights)$",
        ),
        ("timing", "Timing breakdown (s)", r"^timing_s/"),
        ("timing_per_token", "Timing per token (ms)", r"^timing_per_token_ms/"),
    )
)
STAT_SUFFIXES = frozenset({"mean", "max", "min", "std"})
# Metrics a panel draws beside its own, once one of its own exists (they stay in their own
# panel too): the rollout worker's time reads against the trainer's wait for it
# (``timing_s/gen``), its update and its whole step.
PANEL_COMPANIONS = {"async_time": ("timing_s/gen", "timing_s/update_actor", "timing_s/step")}


def metric_panel(name: str) -> dict[str, Any]:
    """Return the panel a metric is drawn in: ``{"key", "title", "order"}``."""
    for order, (key, title, pattern) in enumerate(PANEL_RULES):
        if pattern.search(name):
            return {"key": key, "title": title, "order": order}
    family, _, last = name.rpartition("/")
    family = family if family and last in STAT_SUFFIXES else name
    return {"key": f"metric:{family}", "title": family, "order": len(PANEL_RULES)}


def metric_panels(names: Iterable[str]) -> list[dict[str, Any]]:
    """Return the panels for ``names`` in page order, each with its sorted ``names`` and the
    ``PANEL_COMPANIONS`` it draws too (the charts skip one the run has not recorded)."""
    panels: dict[str, dict[str, Any]] = {}
    for name in names:
        panel = metric_panel(name)
        panels.setdefault(panel["key"], {**panel, "names": []})["names"].append(name)
    for key, panel in panels.items():
        panel["names"] = sorted({*panel["names"], *PANEL_COMPANIONS.get(key, ())})
    return sorted(panels.values(), key=lambda p: (p["order"], p["key"]))


def chunk_series(series: dict[str, dict[str, list]], max_points: int) -> list[dict[str, dict]]:
    """Split ``{name: series}`` into dicts of at most ``max_points`` points, in panel order.

    A series longer than ``max_points`` travels alone. Daphne refuses WebSocket messages over
    1 MiB, and a 20,000-step run's backlog is larger than that in one piece.
    """
    order = sorted(
        series, key=lambda name: (metric_panel(name)["order"], metric_panel(name)["key"], name)
    )
    chunks: list[dict[str, dict]] = []
    size = 0
    for name in order:
        points = len(series[name]["step"])
        if not chunks or size + points > max_points:
            chunks.append({})
            size = 0
        chunks[-1][name] = series[name]
        size += points
    return chunks


def downsample_minmax(values: np.ndarray, max_points: int) -> np.ndarray:
    """Return the indices of ``values`` (n,) to draw: the first, the last and each bucket's extremes.

    The n - 2 inner points are cut into at most ``(max_points - 2) // 2`` buckets of consecutive
    points; each bucket keeps the index of its minimum and of its maximum. The result is sorted,
    unique and at most ``max_points`` long; a series that fits is returned whole (``arange(n)``).
    """
    if max_points < 4:
        raise ValueError(f"max_points={max_points} is too small; ask for at least 4 points")
    n = len(values)
    if n <= max_points:
        return np.arange(n)
    inner = np.asarray(values, dtype=np.float64)[1:-1]  # (n - 2,)
    m = n - 2
    size = -(-m // ((max_points - 2) // 2))  # points per bucket, rounded up
    buckets = -(-m // size)
    low = np.full(buckets * size, np.inf)
    high = np.full(buckets * size, -np.inf)
    low[:m], high[:m] = inner, inner
    offsets = np.arange(buckets) * size + 1  # (buckets,) index of each bucket's first point
    argmin = low.reshape(buckets, size).argmin(axis=1) + offsets
    argmax = high.reshape(buckets, size).argmax(axis=1) + offsets
    return np.unique(np.concatenate(([0], argmin, argmax, [n - 1])))


def _number(value: Any) -> float | None:
    """Return ``value`` as a finite float, or None for null, NaN, inf and non-numbers."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def epoch_seconds(moment: datetime) -> float:
    """Return a timestamp as Unix seconds rounded to the millisecond (what the charts plot)."""
    return round(moment.timestamp(), 3)


def _points(history: list[Segment]) -> Iterator[tuple[int, float, dict[str, Any]]]:
    """Yield every ``(step, unix_seconds, metrics)`` of a run's history in step order (exports)."""
    where, params = history_where(history)
    sql = (
        "SELECT step, extract(epoch FROM wall_time)::float8, metrics::text "
        f"FROM {MetricPoint._meta.db_table} WHERE {where} ORDER BY step"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        while rows := cursor.fetchmany(5000):
            for step, seconds, text in rows:
                yield step, seconds, json.loads(text)


def _table(
    history: list[Segment], names: Sequence[str], step_min: int | None, step_max: int | None
) -> np.ndarray:
    """Return ``(steps, 2 + len(names))`` float64: step, Unix seconds, then each metric (nan: none).

    PostgreSQL extracts the keys as float8, which on a 20,000-step run is several times faster
    than decoding each row's JSON in Python. The recorder stores numbers or null only; a row
    written otherwise (a string, a boolean) fails the cast, and the slower query that checks each
    value's JSON type runs instead.
    """
    where, params = history_where(history, step_min, step_max)

    def fetch(number: str, keys: list[str]) -> list[tuple]:
        columns = "".join(f", {number}" for _ in names)
        sql = (
            f"SELECT step, extract(epoch FROM wall_time)::float8{columns} "
            f"FROM {MetricPoint._meta.db_table} WHERE {where} ORDER BY step"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, keys + params)
            return cursor.fetchall()

    try:
        with transaction.atomic():
            rows = fetch("(metrics ->> %s)::float8", list(names))
    except DataError:
        checked = (
            "CASE WHEN jsonb_typeof(metrics -> %s) = 'number' THEN (metrics ->> %s)::float8 END"
        )
        rows = fetch(checked, [key for name in names for key in (name, name)])
    return np.array(rows, dtype=np.float64).reshape(len(rows), 2 + len(names))


def run_metric_series(
    *,
    run_id: int,
    names: Sequence[str] | None = None,
    step_min: int | None = None,
    step_max: int | None = None,
    max_points: int = DEFAULT_MAX_POINTS,
) -> dict[str, Any]:
    """Return a run's metric series downsampled to ``max_points`` each, as the charts draw them.

    ``{"series": {name: {"step": [...], "time": [...], "value": [...]}}, "last_step", "points",
    "downsampled"}``: ``time`` in Unix seconds, null and non-finite values left out, ``last_step``
    the newest step in the range (None when it holds no step), ``points`` the steps it holds.
    """
    if not 4 <= max_points <= MAX_POINTS_LIMIT:
        raise ValueError(
            f"max_points={max_points} is out of range; ask for 4 to {MAX_POINTS_LIMIT} points"
        )
    if step_min is not None and step_max is not None and step_min > step_max:
        raise ValueError(f"from={step_min} is after to={step_max}; swap them")
    history = run_history(run_id=run_id)
    names = _metric_names(history) if names is None else list(dict.fromkeys(names))
    table = _table(history, names, step_min, step_max)
    steps = table[:, 0].astype(np.int64)
    times = np.array([round(t, 3) for t in table[:, 1].tolist()])  # as the exports round them
    series, downsampled = {}, False
    for i in sorted(range(len(names)), key=names.__getitem__):
        values = table[:, 2 + i]
        keep = np.flatnonzero(np.isfinite(values))
        if not keep.size:
            continue
        if keep.size > max_points:
            keep = keep[downsample_minmax(values[keep], max_points)]
            downsampled = True
        series[names[i]] = {
            "step": steps[keep].tolist(),
            "time": times[keep].tolist(),
            "value": values[keep].tolist(),
        }
    last_step = int(steps[-1]) if len(steps) else None
    return {
        "series": series,
        "last_step": last_step,
        "points": len(steps),
        "downsampled": downsampled,
    }


def run_metric_points_since(*, run_id: int, since_step: int) -> list[dict[str, Any]]:
    """Return every step of the run's history after ``since_step`` as ``{"step", "time", "metrics"}``."""
    history = history_q(run_history(run_id=run_id), step_min=since_step + 1)
    rows = MetricPoint.objects.filter(history).order_by("step")
    return [
        {"step": step, "time": epoch_seconds(wall_time), "metrics": metrics}
        for step, wall_time, metrics in rows.values_list("step", "wall_time", "metrics")
    ]


def run_metric_names(*, run_id: int) -> list[str]:
    """Return every metric name the run's history recorded, sorted."""
    return _metric_names(run_history(run_id=run_id))


def _metric_names(history: list[Segment]) -> list[str]:
    keys = (
        MetricPoint.objects.filter(history_q(history))
        .annotate(key=Func(F("metrics"), function="jsonb_object_keys"))
        .order_by()
        .values_list("key", flat=True)
        .distinct()
    )
    return sorted(keys)


def _csv_number(value: Any) -> str:
    number = _number(value)
    return "" if number is None else repr(number)


def run_metrics_csv_rows(*, run_id: int) -> Iterator[list[str]]:
    """Yield the CSV table of a run's metrics: a header, then one row per step (empty = no value).

    Columns: ``step``, ``wall_time`` (ISO 8601, UTC), ``time`` (Unix seconds, the charts' wall-time
    axis), then every metric name sorted. Numbers are written in full (``repr``) precision; a
    name a spreadsheet would run as a formula gets a leading apostrophe (``webapp.spreadsheet``).
    """
    history = run_history(run_id=run_id)
    names = _metric_names(history)
    yield ["step", "wall_time", "time", *map(spreadsheet_text, names)]
    for step, seconds, metrics in _points(history):
        wall_time = datetime.fromtimestamp(seconds, UTC).isoformat()
        row = [str(step), wall_time, repr(round(seconds, 3))]
        yield row + [_csv_number(metrics.get(name)) for name in names]


def run_metrics_json(*, run_id: int) -> dict[str, Any]:
    """Return a run's metrics as columns: ``{"run_id", "names", "step", "time", "values"}``.

    ``values[name][i]`` is the value at ``step[i]`` (null where the step did not record it).
    """
    history = run_history(run_id=run_id)
    names = _metric_names(history)
    steps: list[int] = []
    times: list[float] = []
    values: dict[str, list[float | None]] = {name: [] for name in names}
    for step, seconds, metrics in _points(history):
        steps.append(step)
        times.append(round(seconds, 3))
        for name in names:
            values[name].append(_number(metrics.get(name)))
    return {"run_id": run_id, "names": names, "step": steps, "time": times, "values": values}
