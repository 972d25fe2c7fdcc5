"""``/api/sweeps``: create over an experiment (every member checked first), read, list, cancel."""

from __future__ import annotations

import pytest

from tests.webapp.api.helpers import errors_of
from tests.webapp.fixtures import make_experiment
from webapp.runs.driver_writes import metric_point_upsert
from webapp.runs.models import Run, RunStatus
from webapp.sweeps.models import Sweep

pytestmark = pytest.mark.django_db

LR = "actor_rollout_ref.actor.optim.lr"
N = "actor_rollout_ref.rollout.n"


def test_a_sweep_is_created_read_and_listed(api, owner):
    experiment = make_experiment(owner)
    body = {
        "experiment": experiment.pk,
        "spec": {
            "mode": "random",
            "count": 2,
            "seed": 3,
            "params": {LR: {"log_uniform": [1e-6, 1e-4]}},
        },
        "concurrency": 1,
        "launch_key": "s" * 32,
    }
    response = api.post("/sweeps", body)
    assert response.status_code == 201, response.json()
    created = response.json()
    assert created["name"] == "tiny grpo" and created["keys"] == [LR]
    assert (created["status"], created["member_count"], created["active_count"]) == (
        "running",
        2,
        2,
    )
    members = created["members"]
    assert [m["index"] for m in members] == [1, 2]
    assert all(1e-6 <= m["values"][LR] <= 1e-4 for m in members)
    assert [m["status"] for m in members] == ["queued", "queued"]
    assert api.post("/sweeps", body).status_code == 200  # the same key: the same sweep
    assert Sweep.objects.count() == 1 and Run.objects.count() == 2

    metric_point_upsert(run_id=members[0]["run_id"], step=1, metrics={"critic/score/mean": 0.25})
    read = api.get(f"/sweeps/{created['id']}").json()
    assert read["members"][0]["reward_final"] == 0.25 and read["members"][1]["reward_final"] is None
    assert [s["id"] for s in api.get("/sweeps").json()["items"]] == [created["id"]]


def test_a_bad_member_comes_back_keyed_by_its_config_key_and_nothing_is_created(api, owner):
    experiment = make_experiment(owner)
    body = {"experiment": experiment.pk, "spec": {"mode": "grid", "params": {N: [4, 1]}}}
    response = api.post("/sweeps", body)
    assert response.status_code == 400
    assert errors_of(response)[N].startswith(f"member 2 of 2 ({N}=1): grpo compares")
    bad_spec = api.post("/sweeps", {"experiment": experiment.pk, "spec": {"mode": "bayes"}})
    assert set(errors_of(bad_spec)) == {"mode", "params"}
    assert not Sweep.objects.exists() and not Run.objects.exists()


def test_cancel_ends_the_queued_members_and_another_user_gets_404s(api, bob, owner):
    experiment = make_experiment(owner)
    spec = {"mode": "grid", "params": {LR: [1e-6, 1e-5]}}
    created = api.post("/sweeps", {"experiment": experiment.pk, "spec": spec}).json()
    assert bob.get(f"/sweeps/{created['id']}").status_code == 404
    assert bob.post(f"/sweeps/{created['id']}/cancel").status_code == 404
    assert bob.post("/sweeps", {"experiment": experiment.pk, "spec": spec}).status_code == 404
    assert bob.get("/sweeps").json()["items"] == []
    cancelled = api.post(f"/sweeps/{created['id']}/cancel").json()
    assert cancelled["status"] == "cancelled"
    assert [m["status"] for m in cancelled["members"]] == ["cancelled", "cancelled"]
    assert set(Run.objects.values_list("status", flat=True)) == {RunStatus.CANCELLED}


METRIC = "val-core/tiny_arithmetic/reward/mean@1"


def test_a_tpe_sweep_with_a_pruner_is_created_and_hostile_settings_name_their_field(api, owner):
    experiment = make_experiment(owner)
    spec = {
        "mode": "tpe",
        "count": 4,
        "seed": 1,
        "params": {LR: {"log_uniform": [1e-6, 1e-4]}},
        "objective": {"metric": METRIC, "direction": "maximize"},
        "pruner": {"type": "median", "n_warmup_steps": 25},
    }
    for bad, key, message in [
        ({"pruner": {"type": "hyperband"}}, "pruner.type", "choose a pruner: median or"),
        (
            {"pruner": {"type": "median", "n_warmup_steps": -5}},
            "pruner.n_warmup_steps",
            "give a whole number from 0 to 1000000",
        ),
        (
            {"objective": {"metric": "val-core/gsm8k/acc/mean@1"}},
            "objective.metric",
            "no member reports it: the validation data's sources are tiny_arithmetic",
        ),
        ({"objective": None}, "objective.metric", "a tpe sweep needs the metric"),
    ]:
        response = api.post("/sweeps", {"experiment": experiment.pk, "spec": {**spec, **bad}})
        assert response.status_code == 400, response.json()
        assert errors_of(response)[key].startswith(message), errors_of(response)
    assert not Sweep.objects.exists() and not Run.objects.exists()
    response = api.post("/sweeps", {"experiment": experiment.pk, "spec": spec, "concurrency": 2})
    assert response.status_code == 201, response.json()
    created = response.json()
    assert created["spec"]["pruner"] == {
        "type": "median",
        "n_startup_trials": 5,
        "n_warmup_steps": 25,
        "interval_steps": 1,
    }
    assert created["strategy"].startswith("Bayesian (Optuna TPE), 4 members, seed 1")
    assert (created["member_count"], created["status"], created["best"]) == (2, "running", None)
    assert [m["pruned"] for m in created["members"]] == [None, None]
