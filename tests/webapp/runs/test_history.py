"""A resumed chain reads as one history: each step once, from the run that owns it."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.urls import reverse

from tests.webapp.live import T0, running_run
from webapp.runs.history import Segment, run_history
from webapp.runs.metrics import (
    run_metric_names,
    run_metric_points_since,
    run_metric_series,
    run_metrics_csv_rows,
    run_metrics_json,
)
from webapp.runs.models import MetricPoint, RunStatus

pytestmark = pytest.mark.django_db


def record(run, steps, tag: float, **extra: float) -> None:
    """Store steps whose ``critic/score/mean`` is ``tag`` (which run wrote it) plus ``extra``."""
    MetricPoint.objects.bulk_create(
        MetricPoint(
            run=run,
            step=step,
            wall_time=T0 + timedelta(seconds=step),
            metrics={"critic/score/mean": tag, "actor/entropy": float(step), **extra},
        )
        for step in steps
    )


@pytest.fixture
def chain(owner):
    """A run that saved at step 10 and died at 17, resumed by one that died at 25 (saved at 20),
    resumed by one that runs on to 30."""
    first = running_run(owner, status=RunStatus.LOST, number=1)
    second = running_run(
        owner, experiment=first.experiment, number=2, parent=first, start_step=10,
        status=RunStatus.LOST,
    )  # fmt: skip
    third = running_run(owner, experiment=first.experiment, number=3, parent=second, start_step=20)
    record(first, range(0, 18), 1.0, **{"val-core/acc": 0.5})
    record(second, range(11, 26), 2.0)
    record(third, range(21, 31), 3.0)
    return first, second, third


def test_the_chain_is_cut_at_each_resume_point(chain):
    first, second, third = chain
    assert run_history(run_id=third.pk) == [
        Segment(first.pk, None, 10),
        Segment(second.pk, 10, 20),
        Segment(third.pk, 20, None),
    ]
    assert run_history(run_id=first.pk) == [Segment(first.pk, None, None)]


def test_the_charts_show_every_step_once_from_the_run_that_owns_it(chain):
    first, second, third = chain
    series = run_metric_series(run_id=third.pk)["series"]["critic/score/mean"]
    assert series["step"] == list(range(0, 31))
    assert series["value"] == [1.0] * 11 + [2.0] * 10 + [3.0] * 10
    # A name only the first run recorded still belongs to the history.
    assert "val-core/acc" in run_metric_names(run_id=third.pk)
    # The parents' own pages keep everything they recorded.
    assert run_metric_series(run_id=first.pk)["series"]["critic/score/mean"]["step"] == list(
        range(0, 18)
    )
    assert run_metric_series(run_id=second.pk)["points"] == 11 + 15


def test_the_live_backlog_and_the_exports_agree_with_the_charts(chain):
    _, _, third = chain
    since = run_metric_points_since(run_id=third.pk, since_step=8)
    assert [p["step"] for p in since] == list(range(9, 31))
    assert [p["metrics"]["critic/score/mean"] for p in since][:3] == [1.0, 1.0, 2.0]
    exported = run_metrics_json(run_id=third.pk)
    assert exported["step"] == list(range(0, 31))
    rows = list(run_metrics_csv_rows(run_id=third.pk))
    assert [int(row[0]) for row in rows[1:]] == list(range(0, 31))


def test_a_queued_resume_shows_its_parent_up_to_the_checkpoint_it_will_load(owner):
    first = running_run(owner, status=RunStatus.CANCELLED)
    record(first, range(1, 8), 1.0)
    queued = running_run(
        owner, experiment=first.experiment, number=2, parent=first, status=RunStatus.QUEUED,
        started_at=None, config={"trainer": {"resume_from_path": "/data/runs/1/global_step_5"}},
    )  # fmt: skip
    assert run_metric_series(run_id=queued.pk)["series"]["critic/score/mean"]["step"] == [
        1, 2, 3, 4, 5,
    ]  # fmt: skip


def test_the_series_the_run_page_and_comparison_fetch_hold_the_whole_chain(chain, client_in):
    first, _, third = chain
    url = reverse("runs:metrics-series", kwargs={"run_id": third.pk})
    body = json.loads(client_in.get(url, {"name": "critic/score/mean"}).content)
    assert body["series"]["critic/score/mean"]["step"] == list(range(0, 31))
