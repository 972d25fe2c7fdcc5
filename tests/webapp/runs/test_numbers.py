"""How a metric's value reads on every page: small magnitudes keep their digits (issue 39, item 4)."""

from __future__ import annotations

import math

import pytest
from django.urls import reverse

from tests.webapp.fixtures import make_experiment
from tests.webapp.live import running_run
from webapp.runs.models import MetricPoint
from webapp.runs.numbers import metric_text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1e-6, "1e-6"),  # a learning rate read as 0.0000 before
        (2.345e-5, "2.35e-5"),  # three significant digits with an exponent
        (-3e-4, "-3e-4"),
        (9.996e-6, "1e-5"),  # the mantissa rounds up to 10: one more power of ten
        (0.001234, "0.001234"),  # four significant digits from 0.001 up
        (0.8125, "0.8125"),
        (1 / 3, "0.3333"),
        (12.3456, "12.35"),
        (1234.56, "1235"),  # the whole part stays whole
        (123456.789, "123457"),
        (0.5, "0.5"),  # no trailing zeros
        (16.0, "16"),  # a whole number is written whole
        (7, "7"),
        (0.0, "0"),
        (1e20, "1e20"),
        (12.125, "12.13"),  # a tie rounds half up, as JavaScript's toFixed does
    ],
)
def test_metric_text_keeps_small_magnitudes(value, text):
    assert metric_text(value) == text


@pytest.mark.parametrize("value", [None, math.nan, math.inf, -math.inf])
def test_a_missing_or_non_finite_value_is_a_dash(value):
    assert metric_text(value) == "—"


def test_a_value_that_is_not_a_number_is_its_text():
    assert metric_text("warmup") == "warmup" and metric_text(True) == "True"


@pytest.mark.django_db
def test_the_run_page_and_the_runs_table_show_a_learning_rate_of_1e_6(client_in, owner):
    run = running_run(owner, experiment=make_experiment(owner))
    MetricPoint.objects.create(
        run=run,
        step=1,
        wall_time="2025-01-01T00:00Z",
        metrics={"actor/lr": 1e-6, "critic/score/mean": 0.8125},
    )
    page = client_in.get(reverse("runs:detail", kwargs={"run_id": run.pk})).content.decode()
    assert "<th>actor/lr</th><td>1e-6</td>" in page
    assert "<th>critic/score/mean</th><td>0.8125</td>" in page
    table = client_in.get(reverse("runs:list"), {"metric": "actor/lr"}).content.decode()
    assert 'title="step 1">1e-6</td>' in table and "0.0000" not in table
