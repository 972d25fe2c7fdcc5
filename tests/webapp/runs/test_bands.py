"""A group's band: mean, min, max and std per step over members of unequal length; its budget."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.webapp.fixtures import make_experiment
from tests.webapp.live import record_steps, running_run, step_metrics
from webapp.runs.bands import band_keep, band_payload, band_stats, group_metric_series
from webapp.runs.models import MetricPoint


def member(steps, values, t0=0.0):
    steps = np.asarray(steps, dtype=np.int64)
    return steps, t0 + steps.astype(float), np.asarray(values, dtype=float)


def test_band_statistics_at_each_step_are_over_the_members_that_recorded_it():
    band = band_stats(
        [
            member([1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0]),
            member([1, 2, 3], [3.0, 4.0, 8.0], t0=10.0),
            member([1, 2], [5.0, np.nan]),  # no value at step 2: not a member there
        ]
    )
    assert band.step.tolist() == [1, 2, 3, 4]
    assert band.n.tolist() == [3, 2, 2, 1]
    # step 1: (1, 3, 5); step 2: (2, 4); step 3: (3, 8); step 4: (4,)
    assert band.mean.tolist() == [3.0, 3.0, 5.5, 4.0]
    assert band.min.tolist() == [1.0, 2.0, 3.0, 4.0]
    assert band.max.tolist() == [5.0, 4.0, 8.0, 4.0]
    # population std: sqrt(((1-3)^2 + 0 + (5-3)^2) / 3), sqrt(1), 2.5, and 0 for one member
    assert band.std.tolist() == pytest.approx([math.sqrt(8 / 3), 1.0, 2.5, 0.0])
    # time: the recorded members' mean seconds (member 2 starts 10 s later)
    assert band.time.tolist() == [(1 + 11 + 1) / 3, (2 + 12) / 2, (3 + 13) / 2, 4.0]


def test_band_of_members_with_no_common_step_and_of_none():
    band = band_stats([member([2], [1.0]), member([5], [3.0])])
    assert band.step.tolist() == [2, 5] and band.n.tolist() == [1, 1]
    assert band.std.tolist() == [0.0, 0.0]
    empty = band_stats([member([], [])])
    assert len(empty.step) == 0 and len(empty.mean) == 0


def test_band_matches_numpy_on_random_members():
    rng = np.random.default_rng(3)
    members = [member(np.arange(1, 1 + n), rng.normal(size=n)) for n in (50, 80, 120)]
    band = band_stats(members)
    at = 60  # step 60: members 2 and 3
    values = [m[2][at - 1] for m in members if len(m[0]) >= at]
    i = int(np.searchsorted(band.step, at))
    assert band.n[i] == 2
    assert band.mean[i] == pytest.approx(np.mean(values))
    assert band.std[i] == pytest.approx(np.std(values))
    assert (band.min[i], band.max[i]) == (min(values), max(values))


def test_band_downsampling_keeps_each_curves_spikes_within_budget():
    rng = np.random.default_rng(0)
    steps = np.arange(1, 20_001)
    quiet = member(steps, rng.normal(size=20_000))
    spiky = member(steps, rng.normal(size=20_000))
    spiky[2][12_344] = 40.0  # one member's spike at step 12,345: the max curve's
    band = band_stats([quiet, spiky])
    keep = band_keep(band, 600)
    assert len(keep) <= 600 and keep[0] == 0 and keep[-1] == 19_999
    assert 12_344 in keep
    assert np.all(np.diff(keep) > 0)
    assert band_keep(band_stats([quiet]), 30_000).tolist() == list(range(20_000))
    payload = band_payload(band, keep)
    assert set(payload) == {"step", "time", "value", "min", "max", "std", "n"}
    assert payload["max"][keep.tolist().index(12_344)] == 40.0
    assert all(len(v) == len(keep) for v in payload.values())


@pytest.mark.django_db
def test_group_series_reads_each_members_history_and_bounds_the_payload(owner):
    experiment = make_experiment(owner)
    runs = [running_run(owner, experiment=experiment, number=n) for n in (1, 2)]
    record_steps(runs[0], range(1, 2001))
    record_steps(runs[1], range(1, 1001))
    MetricPoint.objects.filter(run=runs[1], step=5).update(metrics={"critic/score/mean": 9.0})
    result = group_metric_series(run_ids=[r.pk for r in runs], names=["critic/score/mean"])
    score = result["series"]["critic/score/mean"]
    assert result["last_step"] == 2000 and result["members"] == 2
    assert result["downsampled"] and len(score["step"]) <= 600
    assert 5 in score["step"]  # the max curve's spike at step 5 is kept
    i = score["step"].index(5)
    expected = step_metrics(5)["critic/score/mean"]
    assert score["max"][i] == 9.0 and score["min"][i] == pytest.approx(expected)
    assert score["value"][i] == pytest.approx((9.0 + expected) / 2, rel=1e-6)
    assert score["n"][-1] == 1 and score["n"][0] == 2

    whole = group_metric_series(
        run_ids=[r.pk for r in runs], names=["critic/score/mean"], step_min=990, step_max=1010
    )
    assert whole["series"]["critic/score/mean"]["step"] == list(range(990, 1011))
    assert whole["series"]["critic/score/mean"]["n"] == [2] * 11 + [1] * 10
    with pytest.raises(ValueError, match="max_points=2 is out of range"):
        group_metric_series(run_ids=[runs[0].pk], max_points=2)
