"""Sweep pages: created from the builder, the member table and chart data, cancel, ownership."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse

from engine.trainer.metrics import validation_metric_names
from tests.webapp.fixtures import builder_data, make_experiment, tiny_config
from webapp.experiments.models import Experiment
from webapp.runs.driver_writes import metric_point_upsert
from webapp.runs.models import Run, RunStatus
from webapp.sweeps.models import Sweep
from webapp.sweeps.services import sweep_create

pytestmark = pytest.mark.django_db

LR = "actor_rollout_ref.actor.optim.lr"
N = "actor_rollout_ref.rollout.n"


def sweep_post(owner, **sweep_fields):
    data = builder_data(tiny_config(), owner, name="lr sweep", launch=None)
    data.update({f"sweep-{k}": v for k, v in sweep_fields.items()})
    return data


def test_the_builder_has_the_sweep_section(client_in):
    page = client_in.get(reverse("experiments:new")).content.decode()
    assert 'id="sweep-builder"' in page and 'name="sweep-params"' in page
    assert f'formaction="{reverse("sweeps:new")}"' in page
    assert "js/sweep_builder.js" in page


def test_the_builder_creates_the_experiment_and_a_sweep_of_runs(client_in, owner):
    data = sweep_post(owner, mode="grid", params=f"{LR}: [1e-6, 3e-6]\n{N}: [2, 4]", concurrency=2)
    response = client_in.post(reverse("sweeps:new"), data)
    sweep = Sweep.objects.get()
    assert response.status_code == 302 and response["Location"] == sweep.get_absolute_url()
    assert sweep.experiment.name == "lr sweep" and sweep.concurrency == 2
    runs = Run.objects.filter(experiment=sweep.experiment).order_by("number")
    assert [
        (
            r.config["actor_rollout_ref"]["actor"]["optim"]["lr"],
            r.config["actor_rollout_ref"]["rollout"]["n"],
        )
        for r in runs
    ] == [(1e-6, 2), (1e-6, 4), (3e-6, 2), (3e-6, 4)]


def test_a_random_sweep_from_the_builder_keeps_its_count_and_seed(client_in, owner):
    params = f"{LR}: {{log_uniform: [1e-6, 1e-4]}}"
    data = sweep_post(owner, mode="random", params=params, count=3, seed=11, concurrency=1)
    assert client_in.post(reverse("sweeps:new"), data).status_code == 302
    sweep = Sweep.objects.get()
    assert sweep.spec == {
        "mode": "random",
        "count": 3,
        "seed": 11,
        "params": {LR: {"log_uniform": [1e-6, 1e-4]}},
    }
    assert sweep.members.count() == 3


def test_a_bad_member_shows_its_key_and_member_in_the_builder_and_nothing_is_created(
    client_in, owner
):
    data = sweep_post(owner, mode="grid", params=f"{N}: [4, 1]", concurrency=1)
    response = client_in.post(reverse("sweeps:new"), data)
    assert response.status_code == 400
    page = response.content.decode()
    assert f"{N}: member 2 of 2 ({N}=1): grpo compares" in page.replace("&#x27;", "'")
    assert not Experiment.objects.exists() and not Run.objects.exists()
    assert not Sweep.objects.exists()


def test_create_experiment_with_keys_marked_to_sweep_asks_for_create_sweep(client_in, owner):
    data = sweep_post(owner, mode="grid", params=f"{LR}: [1e-6, 1e-5]", concurrency=1)
    response = client_in.post(reverse("experiments:new"), data)
    assert response.status_code == 400
    page = response.content.decode()
    assert "keys are marked to sweep: press Create sweep, or clear them" in page
    assert f"{LR}: [1e-6, 1e-5]</textarea>" in page  # the marks are kept
    assert not Experiment.objects.exists()


def test_a_grid_with_a_count_and_unreadable_yaml_are_refused_by_the_form(client_in, owner):
    data = sweep_post(owner, mode="grid", params=f"{LR}: [1e-6", count=3, concurrency=1)
    page = client_in.post(reverse("sweeps:new"), data).content.decode()
    assert "the keys to sweep" in page  # the YAML reader's message names the field
    data = sweep_post(owner, mode="grid", params=f"{LR}: [1e-6]", count=3, concurrency=1)
    page = client_in.post(reverse("sweeps:new"), data).content.decode()
    assert "a grid has no count" in page
    assert not Experiment.objects.exists()


def lr_grid(owner, name: str, learning_rates: list[float], *, concurrency: int):
    """Return a new grid sweep of ``owner``'s tiny experiment over the learning rate."""
    return sweep_create(
        experiment=make_experiment(owner),
        name=name,
        spec={"mode": "grid", "params": {LR: learning_rates}},
        concurrency=concurrency,
    )


def record(run, step, score, val=None):
    metrics = {"critic/score/mean": score, "actor/pg_loss": 0.1}
    if val is not None:
        # verl's names for two data sources, one with a slash in it.
        metrics.update(
            validation_metric_names(
                {
                    "openai/gsm8k": {"reward": {"mean@4": val, "std@4": 9.0, "best@4/mean": 9.0}},
                    "math": {"reward": {"mean@4": val + 0.2}},
                }
            )
        )
    metric_point_upsert(run_id=run.pk, step=step, metrics=metrics)


def test_the_sweep_page_shows_each_members_values_metrics_and_the_chart_data(client_in, owner):
    sweep = sweep_create(
        experiment=make_experiment(owner),
        name="lr",
        spec={
            "mode": "grid",
            "params": {LR: [1e-6, 1e-5], "algorithm.adv_estimator": ["grpo", "rloo"]},
        },
        concurrency=2,
    )
    first, second, third, _ = [m.run for m in sweep.members.order_by("index")]
    record(first, 1, 0.2)
    record(first, 2, 0.6, val=0.4)
    record(first, 3, 0.5)  # final reward 0.5, best 0.6; validation from step 2: (0.4 + 0.6) / 2
    record(second, 1, 0.1, val=0.1)
    record(third, 1, float("nan"))  # stored as null: no final reward, no line in the chart
    page = client_in.get(sweep.get_absolute_url()).content.decode()
    rows = {
        int(m.group(1)): m.group(2)
        for m in re.finditer(r'<tr data-member="(\d+)">(.*?)</tr>', page, re.S)
    }
    assert len(rows) == 4
    cells = lambda i: re.findall(r'<td class="num"[^>]*>([^<]*)</td>', rows[i])  # noqa: E731
    assert cells(1) == ["1e-06", "grpo", "0.5", "0.6", "0.5", "0.5"]
    assert cells(2) == ["1e-06", "rloo", "0.1", "0.1", "0.2", "0.2"]
    assert cells(3)[2:] == ["—"] * 4
    state = json.loads(
        re.search(r'id="sweep-state" type="application/json">(.*?)</script>', page).group(1)
    )
    # The page's script reads the same state again as the members move.
    assert client_in.get(reverse("sweeps:state", kwargs={"sweep_id": sweep.pk})).json() == state
    figure = state["parcoords"]
    assert figure["members"] == [1, 2]
    dims = figure["data"][0]["dimensions"]
    assert [d["label"] for d in dims] == [
        LR,
        "algorithm.adv_estimator",
        "final critic/score/mean",
        "final validation score",
    ]
    assert dims[0]["values"] == [1e-6, 1e-6]
    assert dims[1] == {
        "label": "algorithm.adv_estimator",
        "values": [0, 1],
        "tickvals": [0, 1],
        "ticktext": ["grpo", "rloo"],
    }
    assert dims[2]["values"] == [0.5, 0.1] and dims[3]["values"] == [0.5, 0.2]
    # The live overlay: the compare page's section on every member, the reward panel only.
    assert 'id="compare-live"' in page and 'data-panels="score"' in page
    assert re.findall(r'data-compare-run="(\d+)"', page) == [
        str(m.run_id) for m in sweep.members.order_by("index")
    ]
    assert "js/compare.js" in page


def test_the_sweep_state_follows_its_members_to_their_end(client_in, owner):
    sweep = lr_grid(owner, "lr", [1e-6, 1e-5], concurrency=2)
    first, second = [m.run for m in sweep.members.order_by("index")]
    url = reverse("sweeps:state", kwargs={"sweep_id": sweep.pk})
    state = client_in.get(url).json()
    assert (state["status"], state["active_count"]) == ("running", 2)
    assert [m["status"] for m in state["members"]] == ["queued", "queued"]
    assert state["parcoords"]["members"] == []
    record(first, 1, 1e-6)
    Run.objects.filter(pk=first.pk).update(status=RunStatus.SUCCEEDED, latest_step=1)
    state = client_in.get(url).json()
    assert (state["status"], state["active_count"]) == ("running", 1)
    member = state["members"][0]
    assert member["status"] == "succeeded" and member["run_id"] == first.pk
    assert member["reward_final"] == {"value": 1e-6, "text": "1e-6"}
    assert member["progress"]["status"] == "succeeded"
    assert state["members"][1]["reward_final"] == {"value": None, "text": "—"}
    assert state["parcoords"]["members"] == [1]
    Run.objects.filter(pk=second.pk).update(status=RunStatus.FAILED)
    state = client_in.get(url).json()
    assert (state["status"], state["active_count"]) == ("finished", 0)
    page = client_in.get(sweep.get_absolute_url()).content.decode()
    assert 'data-sweep-field="cancel" hidden' in page and 'data-sweep-field="active" hidden' in page


def test_a_value_spread_over_decades_is_drawn_on_a_log_axis():
    from webapp.sweeps.selectors import parcoords_dimension

    dimension = parcoords_dimension(LR, [1e-6, 1e-5, 1e-4])
    assert dimension["label"] == f"{LR} (log)"
    assert [round(v, 9) for v in dimension["values"]] == [-6, -5, -4]
    assert dimension["tickvals"] == [-6, -5, -4]
    assert dimension["ticktext"] == ["1e-6", "1e-5", "1e-4"]
    assert parcoords_dimension(N, [2, 4, 8]) == {"label": N, "values": [2, 4, 8]}


def test_the_list_shows_a_sweeps_status_and_the_nav_links_to_it(client_in, owner):
    sweep = lr_grid(owner, "my lr sweep", [1e-6, 1e-5], concurrency=1)
    page = client_in.get(reverse("sweeps:list")).content.decode()
    assert "my lr sweep" in page and "status-running" in page
    assert f'href="{reverse("sweeps:list")}"' in page
    Run.objects.update(status=RunStatus.SUCCEEDED)
    assert "status-finished" in client_in.get(reverse("sweeps:list")).content.decode()
    client_in.post(reverse("sweeps:cancel", kwargs={"sweep_id": sweep.pk}))
    assert "status-cancelled" in client_in.get(reverse("sweeps:list")).content.decode()


def test_cancel_from_the_page_cancels_the_queued_members(client_in, owner):
    sweep = lr_grid(owner, "lr", [1e-6, 1e-5], concurrency=1)
    response = client_in.post(reverse("sweeps:cancel", kwargs={"sweep_id": sweep.pk}))
    assert response.status_code == 302
    assert set(Run.objects.values_list("status", flat=True)) == {RunStatus.CANCELLED}


def test_another_user_gets_a_404_and_cancels_nothing(client, owner, other_user):
    sweep = lr_grid(owner, "secret sweep", [1e-6], concurrency=1)
    client.force_login(other_user)
    assert client.get(sweep.get_absolute_url()).status_code == 404
    assert client.get(reverse("sweeps:state", kwargs={"sweep_id": sweep.pk})).status_code == 404
    assert client.post(reverse("sweeps:cancel", kwargs={"sweep_id": sweep.pk})).status_code == 404
    assert "secret sweep" not in client.get(reverse("sweeps:list")).content.decode()
    assert Run.objects.get().status == RunStatus.QUEUED
