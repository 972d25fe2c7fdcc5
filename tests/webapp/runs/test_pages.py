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


def test_pages_name_a_run_by_its_id_and_the_launch_note_is_tagged_with_it(client_in, owner):
    first = run_create(experiment=make_experiment(owner, name="a"))
    experiment = make_experiment(owner, name="b")
    response = client_in.post(
        reverse("experiments:launch", kwargs={"experiment_id": experiment.pk}), follow=True
    )
    second = Run.objects.get(experiment=experiment)
    assert (first.number, second.number) == (1, 1) and second.pk != 1
    page = response.content.decode()
    assert f"b</a> · run #{second.pk}</h1>" in page and "run #1<" not in page
    # The run page takes the "queued" note down by this class once the run moves on.
    assert (
        f'class="message launched launched-run-{second.pk} success">Run #{second.pk} queued.'
        in (page)
    )
    table = client_in.get(reverse("runs:list")).content.decode()
    assert f"a · run #{first.pk}</a>" in table and f"b · run #{second.pk}</a>" in table
    assert "#1</a>" not in table
    experiment_page = client_in.get(experiment.get_absolute_url()).content.decode()
    assert f">run #{second.pk}</a>" in experiment_page


def test_the_runs_table_shows_and_filters_by_the_experiments_tags(client_in, owner):
    tagged = run_create(experiment=make_experiment(owner, name="a"))  # tags "tiny, grpo"
    from webapp.experiments.services import experiment_create

    plain = run_create(
        experiment=experiment_create(owner=owner, name="plain", config=tiny_config(), tags="")
    )
    Run.objects.filter(pk=plain.pk).update(tags=["baseline"])
    page = client_in.get(reverse("runs:list"))
    assert page.context["tags"] == ["baseline", "grpo", "tiny"]
    row = page.content.decode().split(f'<tr data-run="{tagged.pk}">')[1].split("</tr>")[0]
    assert 'class="tag inherited"' in row and ">tiny</a>" in row and ">grpo</a>" in row
    filtered = client_in.get(reverse("runs:list"), {"tag": "tiny"}, follow=True)
    assert [row.run.pk for row, *_ in filtered.context["rows"]] == [tagged.pk]
    own = client_in.get(reverse("runs:list"), {"tag": "baseline"}, follow=True)
    assert [row.run.pk for row, *_ in own.context["rows"]] == [plain.pk]
