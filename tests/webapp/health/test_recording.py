"""The health checks on the real recording path: the driver's RunRecorder writes a step to
PostgreSQL, the alert lands with it and goes to the run's group on the real Redis layer; a
check that breaks never costs the step; the badges show on the run page and the run list."""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace

import pytest
from channels.layers import channel_layers
from django.db import connection
from django.template import Context, Template
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tests.webapp.fixtures import make_experiment
from tests.webapp.live import private_redis_layer  # noqa: F401  (fixture)
from webapp.health import checks
from webapp.health.models import HealthAlert, RunHealthState
from webapp.runs.driver_writes import run_claim_for_start, run_mark_running, run_record_step
from webapp.runs.models import MetricPoint, Run
from webapp.runs.services import run_create
from workers.database_recorder import RunRecorder

HEALTHY = {
    "actor/entropy": 0.68,
    "actor/pg_loss": 0.004,
    "actor/kl_loss": 0.01,
    "actor/grad_norm": 1.3,
    "critic/score/mean": 0.2,
    "response_length/mean": 3.5,
}


@pytest.fixture
def running_run(owner):
    run = run_create(experiment=make_experiment(owner))
    run_claim_for_start(run_id=run.pk)
    return run_mark_running(run_id=run.pk)


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
@pytest.mark.usefixtures("private_redis_layer")
def test_a_nan_loss_recorded_by_the_driver_is_stored_and_published(running_run):
    listener = channel_layers.make_backend("default")
    loop = asyncio.new_event_loop()
    channel = loop.run_until_complete(listener.new_channel())
    loop.run_until_complete(listener.group_add(running_run.group_name, channel))
    try:
        recorder = RunRecorder(running_run.pk)  # no publisher: the alert goes out by itself
        recorder.on_step(1, HEALTHY)
        recorder.on_step(2, HEALTHY | {"actor/pg_loss": math.nan})
        recorder.on_step(3, HEALTHY | {"actor/pg_loss": math.inf})  # fired already: no second
        event = loop.run_until_complete(asyncio.wait_for(listener.receive(channel), 5))
        with pytest.raises(TimeoutError):
            loop.run_until_complete(asyncio.wait_for(listener.receive(channel), 0.5))
    finally:
        loop.run_until_complete(listener.group_discard(running_run.group_name, channel))
        loop.close()
    alert = HealthAlert.objects.get()
    assert (alert.run_id, alert.check_name, alert.step) == (running_run.pk, "non_finite_loss", 2)
    assert alert.message == "actor/pg_loss is nan"
    assert event == {
        "type": "run.event",
        "event": "health",
        "run_id": running_run.pk,
        "alert": {
            "check": "non_finite_loss",
            "label": "NaN/inf loss",
            "step": 2,
            "message": "actor/pg_loss is nan",
        },
    }
    # The metric itself is stored as null, as before; the checks kept their state by the run.
    assert MetricPoint.objects.get(run=running_run, step=2).metrics["actor/pg_loss"] is None
    assert RunHealthState.objects.get(run=running_run).state["last_step"] == 3


@pytest.mark.django_db
def test_reward_errors_are_a_share_of_the_samples_the_runs_config_makes(running_run):
    config = running_run.config
    samples = config["data"]["train_batch_size"] * config["actor_rollout_ref"]["rollout"]["n"]
    at_limit = samples // 10  # 10% of the samples, not over it
    run_record_step(run_id=running_run.pk, step=1, metrics=HEALTHY | {"reward/failed": at_limit})
    assert not HealthAlert.objects.exists()
    run_record_step(run_id=running_run.pk, step=2, metrics={"reward/failed": at_limit + 1})
    state = RunHealthState.objects.get(run=running_run)
    assert state.context == {"target_kl": None, "samples_per_step": samples, "total_steps": None}
    alert = HealthAlert.objects.get()
    assert (alert.check_name, alert.step) == ("reward_errors", 2)
    assert f"raised on {at_limit + 1} of {samples} samples" in alert.message


@pytest.mark.django_db
def test_a_retried_step_fires_its_alert_once(running_run):
    for _ in range(2):
        run_record_step(run_id=running_run.pk, step=4, metrics={"critic/vf_loss": math.nan})
    assert list(HealthAlert.objects.values_list("check_name", "step")) == [("non_finite_loss", 4)]


@pytest.mark.django_db
def test_a_check_that_raises_never_costs_the_step(running_run, monkeypatch, caplog):
    def broken(state, step, metrics, context, t):
        # A query that fails inside the step's transaction: only the checks' savepoint is lost.
        with connection.cursor() as cursor:
            cursor.execute("SELECT no_such_column FROM runs_run")

    monkeypatch.setattr(checks, "CHECK_FUNCTIONS", (*checks.CHECK_FUNCTIONS, broken))
    point = run_record_step(run_id=running_run.pk, step=1, metrics={"actor/pg_loss": math.nan})
    assert point is not None
    assert MetricPoint.objects.filter(run=running_run, step=1).exists()
    running_run.refresh_from_db()
    assert running_run.latest_step == 1  # the heartbeat after the checks still ran
    assert not HealthAlert.objects.exists() and not RunHealthState.objects.exists()
    assert "the health checks failed at step 1" in caplog.text


@pytest.mark.django_db
def test_the_badges_show_on_the_run_page_and_the_experiments_runs(client_in, running_run):
    run_record_step(run_id=running_run.pk, step=7, metrics={"actor/pg_loss": math.inf})
    page = client_in.get(running_run.get_absolute_url()).content.decode()
    assert '<section id="run-health" class="health"' in page
    assert (
        '<li class="health-alert" data-check="non_finite_loss"><span class="health-badge" '
        'title="actor/pg_loss is inf">NaN/inf loss</span> <span class="muted">step 7</span> '
        "actor/pg_loss is inf</li>"
    ) in page
    url = reverse("experiments:detail", kwargs={"experiment_id": running_run.experiment_id})
    listing = client_in.get(url).content.decode()
    assert (
        '<span class="health-badge" data-check="non_finite_loss" '
        'title="step 7: actor/pg_loss is inf">NaN/inf loss</span>'
    ) in listing


@pytest.mark.django_db
def test_a_healthy_run_shows_no_badges(client_in, running_run, django_assert_max_num_queries):
    run_record_step(run_id=running_run.pk, step=1, metrics=HEALTHY)
    page = client_in.get(running_run.get_absolute_url()).content.decode()
    assert (
        f'<section id="run-health" class="health" data-run-health="{running_run.pk}" hidden>'
        in page
    )
    assert "health-badge" not in page
    experiment = running_run.experiment
    for _ in range(5):
        run_record_step(
            run_id=run_create(experiment=experiment).pk, step=1, metrics={"actor/pg_loss": math.nan}
        )
    url = reverse("experiments:detail", kwargs={"experiment_id": experiment.pk})
    with django_assert_max_num_queries(40) as queries:
        listing = client_in.get(url).content.decode()
    assert listing.count('class="health-badge"') == 5
    # The alerts of all the runs come in one query, not one per run.
    assert sum("health_healthalert" in q["sql"] for q in queries.captured_queries) == 1


@pytest.mark.django_db
def test_rows_that_carry_runs_get_their_badges_in_one_query(running_run):
    # The runs table's rows are (row, cells) pairs whose row has a ``run``.
    experiment = running_run.experiment
    runs = [running_run, run_create(experiment=experiment), run_create(experiment=experiment)]
    for run in runs[1:]:
        run_record_step(run_id=run.pk, step=3, metrics={"actor/grad_norm": math.inf})
    rows = [(SimpleNamespace(run=Run.objects.get(pk=run.pk)), []) for run in runs]
    template = Template(
        "{% load health %}{% with_health_alerts rows as rows %}"
        "{% for row, cells in rows %}[{{ row.run.number }}:{% health_badges row.run %}]{% endfor %}"
    )
    with CaptureQueriesContext(connection) as queries:
        html = template.render(Context({"rows": rows}))
    assert len(queries) == 1
    badge = (
        '<span class="health-badge" data-check="non_finite_loss" '
        'title="step 3: actor/grad_norm is inf">NaN/inf loss</span>'
    )
    assert html.replace("\n", "") == f"[1:][2:{badge} ][3:{badge} ]"


@pytest.mark.django_db
def test_the_badges_show_in_the_runs_table_in_one_query(client_in, running_run):
    run_record_step(run_id=running_run.pk, step=7, metrics={"actor/pg_loss": math.inf})
    other = run_create(experiment=running_run.experiment)
    run_record_step(run_id=other.pk, step=2, metrics={"response_length/clip_ratio": 0.9})
    with CaptureQueriesContext(connection) as queries:
        page = client_in.get(reverse("runs:list")).content.decode()
    assert (
        '<span class="health-badge" data-check="non_finite_loss" '
        'title="step 7: actor/pg_loss is inf">NaN/inf loss</span>'
    ) in page
    assert 'data-check="length_at_limit" title="step 2: 90% of responses reach' in page
    assert sum("health_healthalert" in q["sql"] for q in queries.captured_queries) == 1
