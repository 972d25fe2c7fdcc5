"""Metric series: min/max downsampling, zoom refinement, panels, exports, progress and pages."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta

import numpy as np
import pytest
from django.contrib.staticfiles import finders
from django.urls import reverse

from tests.webapp.live import T0, record_steps, running_run, step_metrics
from webapp.runs.metrics import (
    chunk_series,
    downsample_minmax,
    metric_panel,
    metric_panels,
    run_metric_names,
    run_metric_points_since,
    run_metric_series,
)
from webapp.runs.models import MetricPoint, RunStatus
from webapp.runs.progress import format_duration, run_progress


def test_downsampling_keeps_first_last_and_each_buckets_extremes():
    values = np.array([0, 5, 1, 9, 2, 8, 3, 7, 4, 6], dtype=float)
    # Two buckets of the eight inner points: [5, 1, 9, 2] and [8, 3, 7, 4].
    assert downsample_minmax(values, 6).tolist() == [0, 2, 3, 5, 6, 9]
    assert downsample_minmax(values, 10).tolist() == list(range(10))


def test_downsampling_a_long_series_keeps_its_spikes_within_budget():
    rng = np.random.default_rng(0)
    values = rng.normal(size=20_000)
    values[12_345] = 50.0  # a loss spike
    values[777] = -50.0
    keep = downsample_minmax(values, 1500)
    assert len(keep) <= 1500 and keep[0] == 0 and keep[-1] == 19_999
    assert 12_345 in keep and 777 in keep
    assert np.all(np.diff(keep) > 0)
    # Every bucket of the inner points contributes its minimum and maximum.
    size = -(-19_998 // 749)
    for start in range(1, 19_999, size):
        chunk = values[start : min(start + size, 19_999)]
        assert start + int(chunk.argmin()) in keep and start + int(chunk.argmax()) in keep


def test_downsampling_refuses_a_budget_too_small_to_draw():
    with pytest.raises(ValueError, match="max_points=3 is too small; ask for at least 4"):
        downsample_minmax(np.arange(10.0), 3)


def test_panels_follow_verl_names_and_group_unknown_families():
    assert metric_panel("critic/score/mean")["key"] == "score"
    assert metric_panel("critic/rewards/max")["key"] == "score"
    assert metric_panel("actor/kl_coef")["key"] == metric_panel("actor/kl_loss")["key"] == "kl"
    assert metric_panel("actor/pg_clipfrac_lower")["key"] == "clip_fraction"
    assert metric_panel("critic/vf_clipfrac")["key"] == "clip_fraction"
    assert metric_panel("critic/grad_norm")["key"] == "grad_norm"
    assert metric_panel("val-core/gsm8k/reward/mean@1")["key"] == "validation"
    assert metric_panel("timing_s/gen")["key"] == "timing"
    # engine.perf's system metrics: one panel each for MFU, memory and CPU.
    assert metric_panel("perf/mfu/actor")["key"] == "mfu"
    for name in (
        "perf/driver/rss_gb",
        "perf/max_rss_gb",
        "perf/max_memory_allocated_gb",
        "perf/max_memory_reserved_gb",
        "perf/cpu_memory_used_gb",
        "perf/min_memory_available_gb",
    ):
        assert metric_panel(name)["key"] == "memory", name
    assert metric_panel("perf/driver/cpu_percent")["key"] == "cpu"
    assert metric_panel("perf/max_cpu_percent")["key"] == "cpu"
    assert metric_panel("critic/values/max")["key"] == "metric:critic/values"
    assert metric_panel("actor/lr")["key"] == "metric:actor/lr"
    panels = metric_panels(
        ["timing_s/gen", "critic/values/min", "critic/score/mean", "timing_s/step", "actor/entropy"]
    )
    assert [(p["key"], p["names"]) for p in panels] == [
        ("score", ["critic/score/mean"]),
        ("entropy", ["actor/entropy"]),
        ("timing", ["timing_s/gen", "timing_s/step"]),
        ("metric:critic/values", ["critic/values/min"]),
    ]


def test_an_async_runs_metrics_are_charted_in_the_async_panels():
    names = [
        "async/staleness_mean",
        "async/staleness_max",
        "async/max_allowed_staleness",
        "async/queue_size",
        "async/dropped_stale_samples",
        "async/dropped_stale_samples_total",
        "async/rollout_policy_version",
        "async/partial_rollout_samples",
        "async/regenerated_after_resume",
        "async/rollout_utilisation",
        "async/trainer_utilisation",
        "timing_s/rollout_worker_gen",
        "timing_s/rollout_worker_gen_cpu",
        "timing_s/sync_rollout_weights",
        "timing_s/gen",
        "timing_s/update_actor",
        "timing_s/step",
    ]
    panels = {p["key"]: p for p in metric_panels(names)}
    assert panels["async_staleness"]["names"] == [
        "async/max_allowed_staleness",
        "async/staleness_max",
        "async/staleness_mean",
    ]
    assert panels["async_queue"]["names"] == ["async/queue_size"]
    assert panels["async_dropped"]["names"] == [
        "async/dropped_stale_samples",
        "async/dropped_stale_samples_total",
    ]
    assert panels["async_version"]["names"] == ["async/rollout_policy_version"]
    assert panels["async_resumed"]["names"] == [
        "async/partial_rollout_samples",
        "async/regenerated_after_resume",
    ]
    assert panels["async_utilisation"]["names"] == [
        "async/rollout_utilisation",
        "async/trainer_utilisation",
    ]
    # The rollout worker's time beside the trainer's wait for it, its update and its step,
    # which stay in the timing breakdown too.
    assert panels["async_time"]["names"] == [
        "timing_s/gen",
        "timing_s/rollout_worker_gen",
        "timing_s/rollout_worker_gen_cpu",
        "timing_s/step",
        "timing_s/sync_rollout_weights",
        "timing_s/update_actor",
    ]
    assert panels["timing"]["names"] == ["timing_s/gen", "timing_s/step", "timing_s/update_actor"]
    assert all(panels[k]["title"].startswith("Async · ") for k in panels if k.startswith("async"))
    # A synchronous run has none of them.
    assert not [
        p for p in metric_panels(["timing_s/gen", "timing_s/step"]) if p["key"].startswith("async")
    ]


@pytest.mark.django_db
def test_series_are_downsampled_per_metric_and_refined_on_a_step_range(owner):
    run = running_run(owner)
    record_steps(run, range(1, 5001))
    MetricPoint.objects.filter(run=run, step=2500).update(
        metrics={**step_metrics(2500), "actor/kl_loss": 99.0, "actor/entropy": None}
    )
    whole = run_metric_series(run_id=run.pk)
    assert whole["last_step"] == 5000 and whole["points"] == 5000 and whole["downsampled"]
    kl = whole["series"]["actor/kl_loss"]
    assert len(kl["step"]) <= 1500 and kl["step"][0] == 1 and kl["step"][-1] == 5000
    assert 99.0 in kl["value"]  # the spike survives
    i = kl["step"].index(2500)
    assert kl["time"][i] == (T0 + timedelta(seconds=2500)).timestamp()
    # A null (a NaN the recorder stored) is left out, not drawn as zero.
    assert 2500 not in whole["series"]["actor/entropy"]["step"]
    assert len(whole["series"]["actor/entropy"]["step"]) <= 1500

    zoom = run_metric_series(run_id=run.pk, names=["actor/kl_loss"], step_min=100, step_max=299)
    assert list(zoom["series"]) == ["actor/kl_loss"] and not zoom["downsampled"]
    assert zoom["series"]["actor/kl_loss"]["step"] == list(range(100, 300))
    assert zoom["series"]["actor/kl_loss"]["value"] == [s / 1000.0 for s in range(100, 300)]
    assert zoom["last_step"] == 299
    with pytest.raises(ValueError, match="max_points=2 is out of range; ask for 4 to 20000"):
        run_metric_series(run_id=run.pk, max_points=2)


@pytest.mark.django_db
def test_values_that_are_not_numbers_are_left_out_of_the_charts(owner):
    run = running_run(owner)
    record_steps(run, range(1, 4))
    MetricPoint.objects.filter(run=run, step=2).update(
        metrics={"actor/kl_loss": "n/a", "actor/entropy": True, "extra/list": [1, 2]}
    )
    series = run_metric_series(run_id=run.pk)["series"]
    assert series["actor/kl_loss"]["step"] == [1, 3]
    assert series["actor/entropy"]["value"] == [step_metrics(s)["actor/entropy"] for s in (1, 3)]
    assert "extra/list" not in series


@pytest.mark.django_db
def test_points_since_a_step_are_exactly_the_later_ones(owner):
    run = running_run(owner)
    record_steps(run, range(1, 21))
    since = run_metric_points_since(run_id=run.pk, since_step=17)
    assert [p["step"] for p in since] == [18, 19, 20]
    assert since[0]["metrics"] == step_metrics(18)
    assert since[0]["time"] == (T0 + timedelta(seconds=18)).timestamp()
    assert run_metric_names(run_id=run.pk) == sorted(step_metrics(1))


@pytest.mark.django_db
def test_exports_hold_the_same_numbers_as_the_charts(client_in, owner):
    run = running_run(owner)
    record_steps(run, range(1, 41))
    MetricPoint.objects.create(
        run=run, step=41, wall_time=T0 + timedelta(seconds=41), metrics={"val-core/x/acc": 0.5}
    )
    charts = run_metric_series(run_id=run.pk)["series"]

    response = client_in.get(reverse("runs:metrics-csv", kwargs={"run_id": run.pk}))
    assert response["Content-Disposition"].endswith(f'-run{run.pk}-metrics.csv"')
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert list(rows[0])[:3] == ["step", "wall_time", "time"]
    assert [int(r["step"]) for r in rows] == list(range(1, 42))
    for name, series in charts.items():
        exported = [(int(r["step"]), float(r[name])) for r in rows if r[name] != ""]
        assert exported == list(zip(series["step"], series["value"], strict=True)), name
    assert rows[-1]["actor/kl_loss"] == "" and rows[-1]["val-core/x/acc"] == "0.5"

    data = json.loads(
        client_in.get(reverse("runs:metrics-json", kwargs={"run_id": run.pk})).content
    )
    assert data["step"] == list(range(1, 42)) and data["names"] == sorted(charts)
    for name, series in charts.items():
        pairs = [
            (s, v) for s, v in zip(data["step"], data["values"][name], strict=True) if v is not None
        ]
        assert pairs == list(zip(series["step"], series["value"], strict=True))
    assert data["time"][0] == charts["actor/kl_loss"]["time"][0]


@pytest.mark.django_db
def test_series_endpoint_refines_a_range_and_names_bad_parameters(client_in, owner, other_user):
    run = running_run(owner)
    record_steps(run, range(1, 101))
    url = reverse("runs:metrics-series", kwargs={"run_id": run.pk})
    data = client_in.get(url, {"name": "actor/kl_loss", "from": "10", "to": "12"}).json()
    assert data["series"] == {
        "actor/kl_loss": {
            "step": [10, 11, 12],
            "time": [(T0 + timedelta(seconds=s)).timestamp() for s in (10, 11, 12)],
            "value": [0.01, 0.011, 0.012],
        }
    }
    bad = client_in.get(url, {"from": "ten"})
    assert bad.status_code == 400
    assert bad.json()["error"] == "from='ten' is not a whole number; pass e.g. from=100"
    swapped = client_in.get(url, {"from": "20", "to": "10"})
    assert swapped.json()["error"] == "from=20 is after to=10; swap them"
    assert client_in.get(url, {"points": "1"}).status_code == 400
    client_in.force_login(other_user)
    assert client_in.get(url).status_code == 404
    assert client_in.get(reverse("runs:metrics-csv", kwargs={"run_id": run.pk})).status_code == 404


def test_progress_shows_step_of_total_elapsed_and_eta():
    progress = run_progress(
        status=RunStatus.RUNNING,
        latest_step=20,
        start_step=0,
        total_steps=100,
        started_at=T0,
        finished_at=None,
        now=T0 + timedelta(seconds=100),
    )
    # 20 steps in 100 s: the 80 left take 400 s.
    assert (progress.percent, progress.elapsed_s, progress.eta_s) == (20.0, 100.0, 400.0)
    assert progress.text == "step 20 / 100 · 1m 40s elapsed · ETA 6m 40s · running"
    resumed = run_progress(
        status=RunStatus.RUNNING,
        latest_step=60,
        start_step=50,
        total_steps=100,
        started_at=T0,
        finished_at=None,
        now=T0 + timedelta(seconds=30),
    )
    assert resumed.eta_s == 120.0  # 10 steps in 30 s since the resume, 40 left
    done = run_progress(
        status=RunStatus.SUCCEEDED,
        latest_step=100,
        start_step=0,
        total_steps=100,
        started_at=T0,
        finished_at=T0 + timedelta(hours=2, minutes=7),
    )
    assert done.eta_s is None and done.text == "step 100 / 100 · 2h 07m elapsed · succeeded"
    queued = run_progress(
        status="queued",
        latest_step=0,
        start_step=0,
        total_steps=None,
        started_at=None,
        finished_at=None,
    )
    assert (queued.percent, queued.text) == (None, "step 0 · queued")
    assert [format_duration(s) for s in (None, 0.4, 59, 65, 3600)] == [
        "—",
        "0s",
        "59s",
        "1m 05s",
        "1h 00m",
    ]


@pytest.mark.django_db
def test_run_page_list_and_comparison_show_progress_and_charts(client_in, owner, other_user):
    run = running_run(owner, total_steps=100, latest_step=25)
    page = client_in.get(run.get_absolute_url()).content.decode()
    assert f'data-run-progress="{run.pk}"' in page and "step 25 / 100" in page
    assert 'class="chart-grid"' in page and "/static/plotly/plotly.min.js" in page
    assert "/static/js/charts.js" in page and "https://" not in page
    experiment_page = client_in.get(run.experiment.get_absolute_url()).content.decode()
    assert "step 25 / 100" in experiment_page and 'style="width: 25.0%"' in experiment_page

    second = running_run(owner, number=2, experiment=run.experiment)
    compare = client_in.get(reverse("runs:compare"), {"run": [run.pk, second.pk]})
    assert [r.pk for r in compare.context["runs"]] == [run.pk, second.pk]
    assert f'data-compare-run="{second.pk}"' in compare.content.decode()
    assert client_in.get(reverse("runs:compare")).status_code == 200
    theirs = running_run(other_user)
    assert client_in.get(reverse("runs:compare"), {"run": [run.pk, theirs.pk]}).status_code == 404


def test_plotly_is_served_from_the_installed_package():
    found = finders.find("plotly/plotly.min.js")
    assert found and found.replace("\\", "/").endswith("plotly/package_data/plotly.min.js")


def test_series_are_chunked_in_panel_order_under_a_point_budget():
    def series(points):
        return {"step": list(range(points)), "time": [0.0] * points, "value": [0.0] * points}

    chunks = chunk_series(
        {
            "timing_s/gen": series(3),
            "actor/kl_loss": series(4),
            "actor/entropy": series(2),
            "critic/values/mean": series(9),
        },
        max_points=6,
    )
    assert [list(chunk) for chunk in chunks] == [
        ["actor/kl_loss", "actor/entropy"],
        ["timing_s/gen"],
        ["critic/values/mean"],  # longer than the budget: alone
    ]
