"""The run pages and actions a user clicks through, each checked for what it shows or changes."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.urls import reverse

from tests.webapp.fixtures import make_experiment, tiny_config
from webapp.runs.models import MetricPoint, Run, RunStatus
from webapp.runs.services import run_create

pytestmark = pytest.mark.django_db


def test_launch_cancel_resume_and_delete_from_the_pages(client_in, owner):
    experiment = make_experiment(owner)
    response = client_in.post(
        reverse("experiments:launch", kwargs={"experiment_id": experiment.pk})
    )
    run = Run.objects.get()
    assert response["Location"] == run.get_absolute_url() and run.status == RunStatus.QUEUED
    client_in.post(reverse("runs:cancel", kwargs={"run_id": run.pk}))
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    response = client_in.post(reverse("runs:resume", kwargs={"run_id": run.pk}), follow=True)
    assert "saved no checkpoint to resume from" in response.content.decode()
    checkpoint = Path(run.checkpoint_dir) / "global_step_4"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.pt").write_bytes(b"x")
    response = client_in.post(reverse("runs:resume", kwargs={"run_id": run.pk}))
    child = Run.objects.get(parent=run)
    assert response["Location"] == child.get_absolute_url()
    assert child.config["trainer"]["resume_from_path"] == str(checkpoint)
    response = client_in.post(reverse("runs:delete", kwargs={"run_id": child.pk}), follow=True)
    assert "cancel it before deleting it" in response.content.decode()
    client_in.post(reverse("runs:delete", kwargs={"run_id": run.pk}))
    assert not Run.objects.filter(pk=run.pk).exists()


def test_run_page_summarises_the_latest_metrics_and_the_diff_shows_changed_keys(client_in, owner):
    lr = tiny_config().actor_rollout_ref.actor.optim.lr
    first = run_create(experiment=make_experiment(owner, name="a"))
    second = run_create(
        experiment=make_experiment(owner, name="b", actor_rollout_ref__actor__optim__lr=lr * 2)
    )
    MetricPoint.objects.create(run=first, step=1, wall_time="2025-01-01T00:00Z", metrics={"x": 1.0})
    MetricPoint.objects.create(
        run=first,
        step=2,
        wall_time="2025-01-01T00:01Z",
        metrics={"zeta": 2.0, "critic/score/mean": 0.625},
    )
    page = client_in.get(reverse("runs:detail", kwargs={"run_id": first.pk}))
    assert page.context["metrics_step"] == 2
    assert page.context["metrics"] == [("critic/score/mean", 0.625), ("zeta", 2.0)]
    response = client_in.get(
        reverse("runs:diff-pick", kwargs={"run_id": first.pk}), {"other": second.pk}
    )
    assert response["Location"] == reverse(
        "runs:diff", kwargs={"run_id": first.pk, "other_run_id": second.pk}
    )
    rows = client_in.get(response["Location"]).context["rows"]
    assert [(r.key, r.left, r.right) for r in rows] == [
        ("actor_rollout_ref.actor.optim.lr", lr, lr * 2)
    ]
