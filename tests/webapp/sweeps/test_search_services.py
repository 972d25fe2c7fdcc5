"""Searching sweeps in the database: a tpe sweep draws each member when a slot frees, from the
members' rows (so a restart changes nothing), never twice for one slot; the pruner stops a member
with its reason and frees its slot; the builder refuses hostile settings under their fields."""

from __future__ import annotations

import re
import threading

import pytest
from django.db import connection
from django.urls import reverse

from tests.webapp.api.helpers import api  # noqa: F401 - a fixture
from tests.webapp.fixtures import builder_data, make_experiment, tiny_config
from tests.webapp.sweeps.test_services import private_queue  # noqa: F401 - a fixture
from webapp.runs.driver_writes import (
    metric_point_upsert,
    run_finish,
    run_record_step,
    run_should_stop,
)
from webapp.runs.models import Run, RunStatus
from webapp.sweeps.models import Sweep, SweepMember
from webapp.sweeps.search import suggest
from webapp.sweeps.selectors import member_histories, sweep_list_for_user, sweep_state
from webapp.sweeps.services import SweepInvalid, sweep_advance, sweep_create, sweeps_advance
from webapp.sweeps.trials import PRUNED, RUNNING

LR = "actor_rollout_ref.actor.optim.lr"
METRIC = "val-core/tiny_arithmetic/reward/mean@1"


def tpe(owner, count=4, concurrency=2, pruner=None, **spec):
    return sweep_create(
        experiment=make_experiment(owner),
        name="search",
        spec={
            "mode": "tpe",
            "count": count,
            "seed": 5,
            "n_startup_trials": 2,
            "params": {LR: {"log_uniform": [1e-6, 1e-4]}},
            "objective": {"metric": METRIC, "direction": "maximize"},
            **({"pruner": pruner} if pruner else {}),
            **spec,
        },
        concurrency=concurrency,
    )


def runs_of(sweep) -> list[Run]:
    return [m.run for m in sweep.members.select_related("run").order_by("index")]


def finish(run, scores: dict[int, float], status=RunStatus.SUCCEEDED) -> None:
    """Record ``scores`` of the objective for ``run`` and end it with ``status``."""
    for step, score in scores.items():
        metric_point_upsert(run_id=run.pk, step=step, metrics={METRIC: score})
    Run.objects.filter(pk=run.pk).update(status=status)


def status_of(sweep) -> str:
    return sweep_list_for_user(user=sweep.owner).get(pk=sweep.pk).status


@pytest.mark.django_db
def test_a_tpe_sweep_queues_its_concurrency_then_draws_each_member_from_the_rows(owner):
    sweep = tpe(owner)
    first, second = runs_of(sweep)
    assert [r.status for r in (first, second)] == [RunStatus.QUEUED] * 2
    values = [m.values[LR] for m in sweep.members.order_by("index")]
    assert all(1e-6 <= v <= 1e-4 for v in values) and values[0] != values[1]
    assert first.config["actor_rollout_ref"]["actor"]["optim"]["lr"] == values[0]
    assert sweep_advance(sweep_id=sweep.pk) == []  # both slots taken
    finish(first, {25: 0.3, 50: 0.5})
    # What any process would draw from the rows as they are: the next member gets exactly that.
    expected = suggest(sweep.spec, member_histories(sweep=sweep))
    [third_id] = sweep_advance(sweep_id=sweep.pk)
    third = SweepMember.objects.get(run_id=third_id)
    assert (third.index, third.values) == (3, expected)
    assert sweep_advance(sweep_id=sweep.pk) == []  # again: the slot is taken, nothing doubles
    finish(second, {}, status=RunStatus.FAILED)
    assert len(sweeps_advance()) == 1  # the dispatch task's call
    assert sweep.members.count() == 4 and status_of(sweep) == "running"
    for run in runs_of(sweep)[2:]:
        finish(run, {25: 0.1})
    assert sweeps_advance() == [] and sweep.members.count() == 4  # its count is reached
    assert status_of(sweep) == "finished"
    states = [h.state for h in member_histories(sweep=sweep)]
    assert states == ["complete", "failed", "complete", "complete"]


@pytest.mark.django_db
def test_a_tpe_sweep_between_members_is_running_and_a_cancelled_one_draws_no_more(owner):
    sweep = tpe(owner, count=3, concurrency=1)
    [first] = runs_of(sweep)
    finish(first, {25: 0.3})
    assert status_of(sweep) == "running"  # no member active, but two to draw
    sweep.cancelled_at = sweep.created_at
    sweep.save(update_fields=["cancelled_at"])
    assert sweep_advance(sweep_id=sweep.pk) == [] and status_of(sweep) == "cancelled"


@pytest.mark.django_db(transaction=True)  # each thread commits on its own connection
def test_workers_advancing_one_sweep_at_once_launch_one_member_per_free_slot(
    owner,
    private_queue,  # noqa: F811
):
    sweep = tpe(owner, count=6, concurrency=2)
    finish(runs_of(sweep)[0], {25: 0.3})
    launched: list[int] = []
    failures: list[BaseException] = []
    barrier = threading.Barrier(4)

    def worker() -> None:
        try:
            barrier.wait()
            launched.extend(sweep_advance(sweep_id=sweep.pk))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert failures == []
    assert len(launched) == 1 and sweep.members.count() == 3
    assert list(sweep.members.values_list("index", flat=True).order_by("index")) == [1, 2, 3]


@pytest.mark.django_db
def test_a_drawn_member_the_config_refuses_stops_the_search_with_the_reason(owner, monkeypatch):
    from webapp.sweeps import services

    sweep = tpe(owner, count=3, concurrency=1)
    finish(runs_of(sweep)[0], {25: 0.3})
    monkeypatch.setattr(services, "suggest", lambda spec, members: {LR: "fast"})
    assert sweep_advance(sweep_id=sweep.pk) == []
    sweep.refresh_from_db()
    assert sweep.stop_reason.startswith(
        "the search stopped: the config refused a drawn member: "
        f"{LR}='fast': member 2 of 3 ({LR}='fast'): expected float"
    )
    assert sweeps_advance() == [] and status_of(sweep) == "finished"


MEDIAN = {"type": "median", "n_startup_trials": 1}


@pytest.mark.django_db
def test_the_pruner_stops_a_member_at_its_validation_step_with_the_reason_and_frees_its_slot(
    owner,
    client_in,
    api,  # noqa: F811
):
    sweep = tpe(owner, count=3, concurrency=1, pruner=MEDIAN)
    [first] = runs_of(sweep)
    finish(first, {25: 0.6, 50: 0.8})
    [second_id] = sweep_advance(sweep_id=sweep.pk)
    second = Run.objects.get(pk=second_id)
    Run.objects.filter(pk=second.pk).update(status=RunStatus.RUNNING)
    # A step without the metric, and one above the median, decide nothing.
    run_record_step(run_id=second.pk, step=24, metrics={"critic/score/mean": 0.1})
    assert not run_should_stop(run_id=second.pk)
    run_record_step(run_id=second.pk, step=25, metrics={METRIC: 0.2, "critic/score/mean": 0.1})
    member = SweepMember.objects.get(run=second)
    reason = member.pruned
    assert {k: reason[k] for k in ("metric", "step", "value", "threshold", "pruner")} == {
        "metric": METRIC,
        "step": 25,
        "value": 0.2,
        "threshold": 0.6,
        "pruner": "median",
    }
    assert reason["text"] == (
        f"best {METRIC} so far = 0.2 at step 25, below the median 0.6 of 1 finished member(s)"
    )
    assert run_should_stop(run_id=second.pk)  # the driver stops after this step
    # and the sweep stops one that does not (runs_stop_unheeded_cancels), timed from now
    assert Run.objects.get(pk=second.pk).cancel_requested_at is not None
    run_record_step(run_id=second.pk, step=26, metrics={METRIC: 0.0})
    assert SweepMember.objects.get(run=second).pruned == reason  # judged once
    assert sweep_advance(sweep_id=sweep.pk) == []  # its slot is held until its run ends
    assert run_finish(run_id=second.pk, status=RunStatus.CANCELLED)
    second.refresh_from_db()
    assert second.status == RunStatus.CANCELLED and second.error == ""
    histories = member_histories(sweep=sweep)
    assert histories[1].state == PRUNED and histories[1].scores == {25: 0.2}  # not step 26
    [third_id] = sweep_advance(sweep_id=sweep.pk)
    assert member_histories(sweep=sweep)[2].state == RUNNING
    # The page and the API show the strategy, the pruned member and why, and the best member.
    sweep = sweep_list_for_user(user=owner).get(pk=sweep.pk)
    state = sweep_state(sweep=sweep)
    assert state["strategy"] == (
        f"Bayesian (Optuna TPE), 3 members, seed 5, 2 random before TPE models the scores; "
        f"maximize {METRIC}; median pruner (n_startup_trials=1, n_warmup_steps=0, "
        "interval_steps=1)"
    )
    assert state["best"]["index"] == 1 and state["best"]["value"]["value"] == 0.8
    assert [m["pruned"] is not None for m in state["members"]] == [False, True, False]
    page = client_in.get(sweep.get_absolute_url()).content.decode()
    assert state["strategy"] in page
    assert "Best member so far:" in page and f"{METRIC} = 0.8" in page
    row = re.search(r'<tr data-member="2">(.*?)</tr>', page, re.S).group(1)
    assert "status-pruned" in row and "below the median 0.6 of 1 finished member(s)" in row
    read = api.get(f"/sweeps/{sweep.pk}").json()
    assert read["best"] == {
        "index": 1,
        "run_id": first.pk,
        "value": 0.8,
        "values": read["members"][0]["values"],
    }
    assert read["members"][1]["pruned"]["threshold"] == 0.6
    assert read["members"][1]["status"] == "cancelled"
    assert read["members"][0]["objective_final"] == 0.8
    assert read["strategy"] == state["strategy"] and read["stop_reason"] == ""
    assert third_id == read["members"][2]["run_id"]


@pytest.mark.django_db
def test_a_grid_sweep_with_a_pruner_stops_members_too(owner):
    sweep = sweep_create(
        experiment=make_experiment(owner),
        name="grid",
        spec={
            "mode": "grid",
            "params": {LR: [1e-6, 1e-5, 1e-4]},
            "objective": {"metric": METRIC, "direction": "minimize"},
            "pruner": {"type": "successive_halving", "min_resource": 25, "reduction_factor": 2},
        },
        concurrency=3,
    )
    first, second, third = runs_of(sweep)
    finish(first, {25: 0.2, 50: 0.1})
    Run.objects.filter(pk__in=[second.pk, third.pk]).update(status=RunStatus.RUNNING)
    run_record_step(run_id=second.pk, step=25, metrics={METRIC: 0.1})  # better: it goes on
    run_record_step(run_id=third.pk, step=25, metrics={METRIC: 0.5})
    assert SweepMember.objects.get(run=second).pruned is None
    pruned = SweepMember.objects.get(run=third).pruned
    assert (pruned["pruner"], pruned["rung"], pruned["threshold"]) == ("successive_halving", 0, 0.1)
    assert "above the cutoff 0.1 of rung 0 (3 member(s) reached it)" in pruned["text"]


def refused(owner, **spec) -> dict[str, str]:
    """Return the errors of a tpe sweep with ``spec``'s fields, by key; nothing is created."""
    spec = {
        "mode": "tpe",
        "count": 4,
        "seed": 0,
        "params": {LR: {"log_uniform": [1e-6, 1e-4]}},
        "objective": {"metric": METRIC},
        **spec,
    }
    with pytest.raises(SweepInvalid) as info:
        sweep_create(experiment=make_experiment(owner), name="x", spec=spec, concurrency=1)
    return {e.key: e.message for e in info.value.errors}


@pytest.mark.django_db
def test_hostile_settings_are_refused_with_the_field_and_the_fix(owner):
    found = refused(owner, pruner={"type": "hyperband"})
    assert found == {
        "pruner.type": "choose a pruner: median or successive_halving (or none: leave the "
        "pruner out)"
    }
    assert set(refused(owner, pruner={"type": ["median"]})) == {"pruner.type"}
    assert set(refused(owner, pruner="median", objective=[])) == {"pruner.type", "objective"}
    found = refused(owner, pruner={"type": "median", "n_warmup_steps": -1, "patience": 2})
    assert found["pruner.n_warmup_steps"] == "give a whole number from 0 to 1000000"
    assert found["pruner"] == (
        "the median pruner takes only n_startup_trials, n_warmup_steps, interval_steps"
    )
    gsm8k = "val-core/gsm8k/reward/mean@1"
    assert refused(owner, objective={"metric": gsm8k})["objective.metric"] == (
        "no member reports it: the validation data's sources are tiny_arithmetic; e.g. "
        "val-core/tiny_arithmetic/reward/mean@1"
    )
    assert refused(owner, objective={"metric": "loss"})["objective.metric"].startswith(
        "no member reports this metric: score members by a validation metric such as "
        "val-core/<data source>/reward/mean@1"
    )
    assert refused(owner, objective={"metric": METRIC, "direction": "up"}) == {
        "objective.direction": "choose maximize (higher is better) or minimize"
    }
    assert set(refused(owner, objective=None)) == {"objective.metric"}
    assert "needs the metric" in refused(owner, objective=None)["objective.metric"]
    found = refused(owner, n_startup_trials=0)
    assert found["n_startup_trials"] == "give a whole number from 1 to 256"
    # The space is checked at every bound and choice before anything is created.
    found = refused(owner, params={LR: [1e-6, "fast"]})
    assert found[LR].startswith(f"the search space at ({LR}='fast'): expected float")
    assert not Sweep.objects.exists() and not Run.objects.exists()


@pytest.mark.django_db
def test_an_experiment_that_never_validates_cannot_be_scored_by_a_validation_metric(owner):
    experiment = make_experiment(owner, trainer__test_freq=-1)
    with pytest.raises(SweepInvalid) as info:
        sweep_create(
            experiment=experiment,
            name="x",
            spec={
                "mode": "random",
                "count": 2,
                "seed": 0,
                "params": {LR: {"log_uniform": [1e-6, 1e-4]}},
                "objective": {"metric": METRIC},
                "pruner": {"type": "median"},
            },
            concurrency=1,
        )
    [error] = info.value.errors
    assert error.key == "objective.metric"
    assert error.message.startswith("no member reports it: the experiment never validates")


def sweep_post(owner, **sweep_fields):
    data = builder_data(tiny_config(), owner, name="search", launch=None)
    data.update({f"sweep-{k}": v for k, v in sweep_fields.items()})
    return data


def field_errors(page: str, field: str) -> list[str]:
    found = re.search(rf'data-errors-for="sweep-{field}">(.*?)</ul>', page, re.S)
    return re.findall(r"<li>(.*?)</li>", found.group(1)) if found else []


def tpe_post(owner, **fields) -> dict:
    """Return the builder's POST of a 3-trial TPE search over the learning rate, with ``fields``."""
    return sweep_post(
        owner,
        mode="tpe",
        params=f"{LR}: {{log_uniform: [1e-6, 1e-4]}}",
        count=3,
        seed=1,
        concurrency=1,
        **fields,
    )


@pytest.mark.django_db
def test_the_builder_creates_a_tpe_sweep_with_its_pruner(client_in, owner):
    data = tpe_post(
        owner,
        metric=METRIC,
        direction="maximize",
        pruner="successive_halving",
        pruner_min_resource=25,
    )
    response = client_in.post(reverse("sweeps:new"), data)
    assert response.status_code == 302, response.content.decode()[-3000:]
    sweep = Sweep.objects.get()
    assert sweep.spec["pruner"] == {
        "type": "successive_halving",
        "min_resource": 25,
        "reduction_factor": 3,
        "min_early_stopping_rate": 0,
    }
    assert sweep.spec["n_startup_trials"] == 10 and sweep.members.count() == 1


@pytest.mark.django_db
def test_the_builder_shows_each_refused_setting_under_its_field(client_in, owner):
    data = tpe_post(
        owner,
        metric="val-core/gsm8k/acc/mean@1",
        pruner="median",
        pruner_n_warmup_steps=-2,
        pruner_min_resource=3,
    )
    response = client_in.post(reverse("sweeps:new"), data)
    assert response.status_code == 400
    page = response.content.decode()
    assert field_errors(page, "pruner_min_resource") == [
        "the median pruner has no such setting; leave it empty"
    ]
    data.pop("sweep-pruner_min_resource")
    page = client_in.post(reverse("sweeps:new"), data).content.decode()
    assert field_errors(page, "pruner_n_warmup_steps") == ["give a whole number from 0 to 1000000"]
    data["sweep-pruner_n_warmup_steps"] = "2"
    page = client_in.post(reverse("sweeps:new"), data).content.decode()
    assert field_errors(page, "metric")[0].startswith(
        "no member reports it: the validation data&#x27;s sources are tiny_arithmetic"
    )
    data.update({"sweep-pruner": "", "sweep-metric": METRIC})
    page = client_in.post(reverse("sweeps:new"), data).content.decode()
    assert field_errors(page, "pruner_n_warmup_steps") == [
        "choose a pruner, or leave its settings empty"
    ]
    assert not Sweep.objects.exists() and not Run.objects.exists()


@pytest.mark.django_db
def test_a_member_the_run_quota_refuses_waits_for_the_next_dispatch(owner, settings):
    from webapp.runs.services import run_create

    settings.POSTTRAIN_MAX_QUEUED_RUNS_PER_USER = 1
    sweep = tpe(owner, count=2, concurrency=1)
    finish(runs_of(sweep)[0], {25: 0.3})
    other = run_create(experiment=make_experiment(owner, name="other"))  # takes the quota
    assert sweep_advance(sweep_id=sweep.pk) == []
    sweep.refresh_from_db()
    assert sweep.stop_reason == "" and sweep.members.count() == 1
    Run.objects.filter(pk=other.pk).update(status=RunStatus.CANCELLED)
    assert len(sweep_advance(sweep_id=sweep.pk)) == 1
