"""``/api/runs``: lists, status, cancel, resume and the charts' own metric series."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.webapp.api.helpers import errors_of
from tests.webapp.fixtures import make_experiment
from tests.webapp.live import record_steps, running_run
from webapp.runs.metrics import run_metric_series, run_metrics_json
from webapp.runs.models import Run, RunStatus
from webapp.runs.services import run_create

pytestmark = pytest.mark.django_db


def stopped_run_with_checkpoint(owner) -> Run:
    run = run_create(experiment=make_experiment(owner))
    Run.objects.filter(pk=run.pk).update(status=RunStatus.CANCELLED)
    checkpoint = Path(run.checkpoint_dir) / "global_step_1"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.pt").write_bytes(b"x")
    run.refresh_from_db()
    return run


def test_runs_are_listed_by_status_and_experiment_and_read_with_their_config(api, owner):
    running = running_run(owner)
    stopped = stopped_run_with_checkpoint(owner)
    listed = api.get("/runs").json()
    assert [r["id"] for r in listed["items"]] == [stopped.pk, running.pk]
    assert [r["id"] for r in api.get("/runs", {"status": "running"}).json()["items"]] == [
        running.pk
    ]
    by_experiment = api.get("/runs", {"experiment": stopped.experiment_id}).json()["items"]
    assert [r["id"] for r in by_experiment] == [stopped.pk]
    assert api.get("/runs", {"status": "sideways"}).status_code == 422
    Run.objects.filter(pk=running.pk).update(tags=["lr-sweep", "best"])
    assert [r["id"] for r in api.get("/runs", {"tag": "BEST"}).json()["items"]] == [running.pk]
    both = api.get("/runs", {"status": ["running", "cancelled"]}).json()["items"]
    assert {r["id"] for r in both} == {running.pk, stopped.pk}
    lr = stopped.config["actor_rollout_ref"]["actor"]["optim"]["lr"]
    by_config = api.get("/runs", {"config": f"actor_rollout_ref.actor.optim.lr={lr}"}).json()
    assert [r["id"] for r in by_config["items"]] == [stopped.pk]
    bad = api.get("/runs", {"config": "nonsense"})
    assert bad.status_code == 400 and "is not <dotted key>=<value>" in errors_of(bad)[None]

    detail = api.get(f"/runs/{stopped.pk}").json()
    assert detail["config"] == stopped.config and detail["experiment_name"] == "tiny grpo"
    assert (detail["status"], detail["active"], detail["can_resume"]) == ("cancelled", False, True)
    status = api.get(f"/runs/{running.pk}/status").json()
    assert status == {
        "id": running.pk, "status": "running", "active": True, "cancel_requested": False,
        "latest_step": 0, "total_steps": 100, "error": "",
    }  # fmt: skip


def test_cancel_asks_a_running_run_to_stop_and_resume_queues_its_continuation(api, owner):
    running = running_run(owner)
    response = api.post(f"/runs/{running.pk}/cancel")
    assert response.status_code == 200 and response.json()["cancel_requested"] is True
    assert Run.objects.get(pk=running.pk).cancel_requested

    refused = api.post(f"/runs/{running.pk}/resume")
    assert refused.status_code == 409
    assert "only a cancelled, failed or lost run resumes" in errors_of(refused)[None]

    stopped = stopped_run_with_checkpoint(owner)
    resumed = api.post(f"/runs/{stopped.pk}/resume", {"launch_key": "r" * 16})
    assert resumed.status_code == 201, resumed.content
    child = Run.objects.get(parent=stopped)
    assert resumed.json()["id"] == child.pk and resumed.json()["parent_id"] == stopped.pk
    assert child.config["trainer"]["resume_mode"] == "resume_path"
    again = api.post(f"/runs/{stopped.pk}/resume", {"launch_key": "r" * 16})
    assert again.status_code == 200 and again.json()["id"] == child.pk


def test_metric_series_are_the_charts_own_downsampled_series(api, owner):
    run = running_run(owner, total_steps=500)
    record_steps(run, range(1, 501))
    response = api.get(f"/runs/{run.pk}/metrics", {"name": "critic/score/mean", "points": 20})
    assert response.status_code == 200
    expected = run_metric_series(run_id=run.pk, names=["critic/score/mean"], max_points=20)
    assert response.json() == {"run_id": run.pk, **expected}
    assert response.json()["downsampled"] is True
    assert len(response.json()["series"]["critic/score/mean"]["step"]) <= 20

    window = api.get(f"/runs/{run.pk}/metrics", {"from": 100, "to": 120}).json()
    assert window["series"]["actor/kl_loss"]["step"] == list(range(100, 121))
    assert window == {
        "run_id": run.pk,
        **run_metric_series(run_id=run.pk, step_min=100, step_max=120),
    }

    assert api.get(f"/runs/{run.pk}/metrics/all").json() == run_metrics_json(run_id=run.pk)

    swapped = api.get(f"/runs/{run.pk}/metrics", {"from": 9, "to": 3})
    assert swapped.status_code == 400 and errors_of(swapped)["from"] == (
        "from=9 is after to=3; swap them"
    )
    few = api.get(f"/runs/{run.pk}/metrics", {"points": 2})
    assert few.status_code == 400 and "ask for 4 to" in errors_of(few)["points"]
    assert api.get(f"/runs/{run.pk}/metrics", {"from": -1}).status_code == 422


def test_another_users_run_is_a_404_everywhere(api, bob, owner):
    run = stopped_run_with_checkpoint(owner)
    for method, path in [
        ("get", ""), ("get", "/status"), ("post", "/cancel"), ("post", "/resume"),
        ("get", "/metrics"), ("get", "/metrics/all"), ("get", "/samples"),
        ("get", "/samples/steps"), ("get", "/samples/group?prompt=0"), ("get", "/samples/export"),
    ]:  # fmt: skip
        response = getattr(bob, method)(f"/runs/{run.pk}{path}")
        assert response.status_code == 404, (method, path, response.content)
    assert bob.get("/runs").json()["count"] == 0
    assert Run.objects.count() == 1
