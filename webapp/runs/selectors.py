"""Read queries on runs: what a user may see, the latest metrics, checkpoints and config diffs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db.models import QuerySet

from engine.trainer.checkpoint import latest_checkpoint
from webapp.projects.access import visible_runs
from webapp.runs.models import MetricPoint, Run

# The metrics the run page summarises first, in verl's names.
SUMMARY_METRICS = (
    "critic/score/mean",
    "critic/rewards/mean",
    "critic/advantages/mean",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/entropy",
    "actor/pg_clipfrac",
    "actor/grad_norm",
    "response_length/mean",
    "timing_s/step",
    "perf/throughput",
)


def run_list_for_user(
    *, user: Any, experiment_id: int | None = None, status: str | None = None
) -> QuerySet[Run]:
    """Return the runs ``user`` may read (``webapp.projects.access``), optionally of one
    experiment or status."""
    runs = visible_runs(user).select_related("experiment", "external")
    if experiment_id is not None:
        runs = runs.filter(experiment_id=experiment_id)
    if status:
        runs = runs.filter(status=status)
    return runs


def run_latest_checkpoint(*, run: Run) -> Path | None:
    """Return the run's newest complete ``global_step_<N>`` folder, or None if it saved none."""
    return latest_checkpoint(run.checkpoint_dir)


def run_latest_metrics(*, run: Run) -> tuple[int | None, list[tuple[str, float | None]]]:
    """Return the last recorded step and its metrics, the summary names first, then the rest."""
    point = MetricPoint.objects.filter(run=run).order_by("-step").first()
    if point is None:
        return None, []
    metrics = point.metrics
    first = [(k, metrics[k]) for k in SUMMARY_METRICS if k in metrics]
    rest = sorted((k, v) for k, v in metrics.items() if k not in SUMMARY_METRICS)
    return point.step, first + rest


def flatten_config(config: Any, prefix: str = "") -> dict[str, Any]:
    """Return a nested config dict as ``{"dotted.key": value}`` (lists stay whole values)."""
    if not isinstance(config, dict) or (prefix and not config):
        return {prefix: config}
    flat: dict[str, Any] = {}

    def walk(node: dict[str, Any], path: str) -> None:  # into one dict: run groups flatten many
        for key, value in node.items():
            dotted = f"{path}.{key}" if path else str(key)
            if isinstance(value, dict) and value:
                walk(value, dotted)
            else:
                flat[dotted] = value

    walk(config, prefix)
    return flat


@dataclass(frozen=True)
class ConfigDifference:
    key: str
    left: Any
    right: Any
    only_left: bool = False
    only_right: bool = False


# Keys that differ between any two runs by construction.
RUN_SPECIFIC_KEYS = ("trainer.default_local_dir",)


def run_config_diff(*, left: Run, right: Run) -> list[ConfigDifference]:
    """Return the config keys whose values differ between two runs, sorted by key."""
    a, b = flatten_config(left.config), flatten_config(right.config)
    rows = []
    for key in sorted(a.keys() | b.keys()):
        if key in RUN_SPECIFIC_KEYS or a.get(key) == b.get(key) and (key in a) == (key in b):
            continue
        rows.append(ConfigDifference(key, a.get(key), b.get(key), key not in b, key not in a))
    return rows
