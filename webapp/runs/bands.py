"""A run group's curves: per step, the mean of its members with their min, max and std.

A group of seed runs (``webapp.runs.groups``) is drawn as one mean line in a band, min to max or
mean ± std (the page's toggle), as W&B and Aim draw grouped runs. The statistics at a step are
over the members that recorded the metric at that step: members of unequal length (one still
running, one that failed at step 300) make a band that narrows to the members left, and ``n``
says how many there were. ``std`` is the population standard deviation (``ddof=0``): the spread
of these members, 0 where one member is left.

Members are read whole from PostgreSQL (each through its resume history, as its run page reads
it) and aligned by step; only then is the band downsampled, so every member's steps count. The
payload stays bounded: each series keeps at most ``max_points`` steps, chosen as the union of the
min/max buckets (``metrics.downsample_minmax``) of the mean, the lower and the upper curve, a
third of the budget each, so a spike in any of the three survives. A group's series carries seven
arrays where a run's carries three, so its default budget is lower than a run's
(``GROUP_MAX_POINTS``); zooming asks for the visible range at the same budget, as for a run.
On the wall-time axis a step is drawn at its members' mean time (members start at different
times, so it is an indication, not any one run's clock).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from webapp.runs.history import run_history
from webapp.runs.metrics import (
    MAX_POINTS_LIMIT,
    _metric_names,
    _table,
    downsample_minmax,
)

GROUP_MAX_POINTS = 600
# 7 significant digits: what a float32 metric holds; the JSON is about half as long as repr's.
DIGITS = 7


class Band(NamedTuple):
    """A group's statistics at each step any member recorded: every array is ``(steps,)``."""

    step: np.ndarray  # int64, ascending
    time: np.ndarray  # the members' mean Unix seconds at the step
    mean: np.ndarray
    min: np.ndarray
    max: np.ndarray
    std: np.ndarray  # population std (ddof=0)
    n: np.ndarray  # int64: members that recorded the step


def band_stats(members: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> Band:
    """Return the band of ``members``, each ``(steps (n_i,), times (n_i,), values (n_i,))``.

    Non-finite values are left out (the member did not record the metric there). The steps are
    the union of every member's; at each, the statistics are over the members that recorded it.
    """
    kept = [(s[np.isfinite(v)], t[np.isfinite(v)], v[np.isfinite(v)]) for s, t, v in members]
    steps = np.unique(np.concatenate([s for s, _, _ in kept] or [np.empty(0, np.int64)]))
    steps = steps.astype(np.int64)  # (S,)
    values = np.full((len(kept), len(steps)), np.nan)  # (M, S), nan: not recorded
    times = np.full((len(kept), len(steps)), np.nan)  # (M, S)
    for i, (s, t, v) in enumerate(kept):
        at = np.searchsorted(steps, s)  # (n_i,) each step's column
        values[i, at] = v
        times[i, at] = t
    recorded = np.isfinite(values)  # (M, S)
    n = recorded.sum(axis=0)  # (S,) >= 1 at every step of the union
    if not len(steps):
        empty = np.empty(0)
        return Band(steps, empty, empty, empty, empty, empty, n)
    total = np.where(recorded, values, 0.0).sum(axis=0)  # (S,)
    mean = total / n  # (S,)
    spread = np.where(recorded, (values - mean) ** 2, 0.0).sum(axis=0)  # (S,)
    return Band(
        step=steps,
        time=np.where(recorded, times, 0.0).sum(axis=0) / n,
        mean=mean,
        min=np.where(recorded, values, np.inf).min(axis=0),
        max=np.where(recorded, values, -np.inf).max(axis=0),
        std=np.sqrt(spread / n),
        n=n,
    )


def band_keep(band: Band, max_points: int) -> np.ndarray:
    """Return the indices of ``band``'s steps to send: all, or at most ``max_points`` of them.

    The union of the min/max buckets of the mean, the min and the max curve, each given a third
    of the budget, sorted. (mean ± std lies inside [min, max] nearly always; where one member
    stands far off it may not, and its step is then kept through the min or max curve.)
    """
    count = len(band.step)
    if count <= max_points:
        return np.arange(count)
    third = max(4, max_points // 3)
    picks = [downsample_minmax(curve, third) for curve in (band.mean, band.min, band.max)]
    return np.unique(np.concatenate(picks))


def _round(values: np.ndarray) -> list[float]:
    return [float(f"{v:.{DIGITS}g}") for v in values.tolist()]


def band_payload(band: Band, keep: np.ndarray) -> dict[str, list]:
    """Return the kept steps of ``band`` as JSON lists (``value`` is the mean, as for a run)."""
    return {
        "step": band.step[keep].tolist(),
        "time": [round(t, 3) for t in band.time[keep].tolist()],
        "value": _round(band.mean[keep]),
        "min": _round(band.min[keep]),
        "max": _round(band.max[keep]),
        "std": _round(band.std[keep]),
        "n": band.n[keep].tolist(),
    }


def group_metric_series(
    *,
    run_ids: Sequence[int],
    names: Sequence[str] | None = None,
    step_min: int | None = None,
    step_max: int | None = None,
    max_points: int = GROUP_MAX_POINTS,
) -> dict[str, Any]:
    """Return the band series of the runs ``run_ids`` (visible to the caller: checked by it).

    ``{"series": {name: {"step", "time", "value" (mean), "min", "max", "std", "n"}},
    "last_step", "members", "downsampled"}``; ``last_step`` is the newest step any member
    recorded in the range (None when none did).
    """
    if not 4 <= max_points <= MAX_POINTS_LIMIT:
        raise ValueError(
            f"max_points={max_points} is out of range; ask for 4 to {MAX_POINTS_LIMIT} points"
        )
    if step_min is not None and step_max is not None and step_min > step_max:
        raise ValueError(f"from={step_min} is after to={step_max}; swap them")
    histories = [run_history(run_id=run_id) for run_id in run_ids]
    if names is None:  # one query over every member's history
        names = _metric_names([segment for history in histories for segment in history])
    else:
        names = list(dict.fromkeys(names))
    tables = [_table(history, names, step_min, step_max) for history in histories]
    series, downsampled, last_step = {}, False, None
    for i, name in sorted(enumerate(names), key=lambda item: item[1]):
        band = band_stats([(t[:, 0].astype(np.int64), t[:, 1], t[:, 2 + i]) for t in tables])
        if not len(band.step):
            continue
        keep = band_keep(band, max_points)
        downsampled = downsampled or len(keep) < len(band.step)
        series[name] = band_payload(band, keep)
        last_step = max(last_step or 0, int(band.step[-1]))
    return {
        "series": series,
        "last_step": last_step,
        "members": len(run_ids),
        "downsampled": downsampled,
    }
