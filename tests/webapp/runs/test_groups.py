"""Run groups: which runs group together, by seed or by a chosen key; the pages that group them."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from django.urls import reverse

from engine.config import load_config
from engine.config.keys import config_to_dict
from tests.webapp.fixtures import make_experiment
from tests.webapp.live import record_steps, running_run
from webapp.runs.groups import (
    GroupByError,
    group_runs,
    groupable_runs,
    is_seed_key,
    run_group_for_user,
)
from webapp.runs.models import Run, RunStatus
from webapp.runs.selectors import flatten_config, run_list_for_user

pytestmark = pytest.mark.django_db

LR = "actor_rollout_ref.actor.optim.lr"


def with_values(config: dict[str, Any], **values: Any) -> dict[str, Any]:
    """Return a copy of ``config`` with dotted keys (``trainer__seed``) set."""
    config = copy.deepcopy(config)
    for dotted, value in values.items():
        *parents, last = dotted.split("__")
        node = config
        for part in parents:
            node = node[part]
        node[last] = value
    return config


def config_run(
    owner: Any, experiment: Any, number: int, *, parent: Run | None = None, **values: Any
) -> Run:
    """Create a finished run of ``experiment`` whose config has ``values`` set."""
    return running_run(
        owner,
        experiment=experiment,
        number=number,
        parent=parent,
        status=RunStatus.SUCCEEDED,
        config=with_values(experiment.config, **values),
    )


def test_every_seed_key_of_the_engine_schema_is_found_by_its_name():
    keys = flatten_config(config_to_dict(load_config("grpo_tiny")))
    assert sorted(k for k in keys if is_seed_key(k)) == [
        "actor_rollout_ref.actor.data_loader_seed",
        "actor_rollout_ref.actor.fsdp_config.seed",
        "actor_rollout_ref.ref.fsdp_config.seed",
        "critic.data_loader_seed",
        "critic.model.fsdp_config.seed",
        "data.seed",
        "trainer.seed",
    ]
    assert not is_seed_key("data.seedless") and not is_seed_key("trainer.seeds")


def test_runs_that_differ_only_by_seeds_are_one_group(owner):
    experiment = make_experiment(owner)
    runs = [
        config_run(owner, experiment, 1, trainer__seed=1, data__seed=1),
        config_run(owner, experiment, 2, trainer__seed=2, data__seed=7),
        config_run(
            owner,
            experiment,
            3,
            trainer__seed=3,
            actor_rollout_ref__actor__data_loader_seed=5,
            trainer__default_local_dir="/elsewhere",  # run-specific: never tells runs apart
        ),
    ]
    [group] = group_runs(runs, by="seed")
    assert group.run_ids == [r.pk for r in runs]
    assert group.varied["trainer.seed"] == [1, 2, 3]
    assert "trainer.default_local_dir" not in group.varied
    assert group.label == "tiny grpo · 3 seeds"
    assert group.members_text.startswith(f"#{runs[0].pk} (")
    assert "seed 2" in group.members_text


def test_a_differing_key_makes_separate_groups_labelled_by_it(owner):
    experiment = make_experiment(owner)
    low = [config_run(owner, experiment, n, trainer__seed=n) for n in (1, 2)]
    high = [
        config_run(owner, experiment, n, trainer__seed=n, actor_rollout_ref__actor__optim__lr=0.1)
        for n in (3, 4)
    ]
    groups = group_runs([low[0], high[0], low[1], high[1]], by="seed")
    assert [g.run_ids for g in groups] == [[r.pk for r in low], [r.pk for r in high]]
    default_lr = flatten_config(experiment.config)[LR]
    assert [g.label for g in groups] == [
        f"tiny grpo · lr={default_lr} · 2 seeds",
        "tiny grpo · lr=0.1 · 2 seeds",
    ]
    assert len({g.token for g in groups}) == 2
    assert all(g.token.startswith("seed:") for g in groups)


def test_grouping_by_a_chosen_key_keeps_seeds_apart(owner):
    experiment = make_experiment(owner)
    a = config_run(owner, experiment, 1, trainer__seed=1, actor_rollout_ref__actor__optim__lr=0.1)
    b = config_run(owner, experiment, 2, trainer__seed=1, actor_rollout_ref__actor__optim__lr=0.2)
    c = config_run(owner, experiment, 3, trainer__seed=2, actor_rollout_ref__actor__optim__lr=0.1)
    by_lr = group_runs([a, b, c], by=LR)
    assert [g.run_ids for g in by_lr] == [[a.pk, b.pk], [c.pk]]
    assert by_lr[0].varied == {LR: [0.1, 0.2]}
    assert by_lr[0].label == "tiny grpo · seed=1 · 2 values of lr"
    assert by_lr[1].label == f"tiny grpo · seed=2 · run #{c.pk}"
    assert [g.run_ids for g in group_runs([a, b, c], by="seed")] == [[a.pk, c.pk], [b.pk]]


def test_a_grouping_that_cannot_apply_is_refused_with_the_fix(owner):
    run = config_run(owner, make_experiment(owner), 1)
    with pytest.raises(GroupByError, match="no run here has that config key"):
        group_runs([run], by="trainer.no_such_key")
    with pytest.raises(GroupByError, match="is not a config key; group by seed"):
        group_runs([run], by="trainer.seed; DROP TABLE")
    with pytest.raises(GroupByError, match="say what to group by"):
        group_runs([run], by="")


def test_a_resumed_run_is_grouped_through_its_resumption(owner):
    experiment = make_experiment(owner)
    first = config_run(owner, experiment, 1, trainer__seed=1)
    resumed = config_run(
        owner,
        experiment,
        2,
        trainer__seed=1,
        trainer__resume_mode="resume_path",
        trainer__resume_from_path="/runs/1/global_step_10",
        parent=first,
    )
    other = config_run(owner, experiment, 3, trainer__seed=2)
    runs = list(groupable_runs(run_list_for_user(user=owner)))
    assert {r.pk for r in runs} == {resumed.pk, other.pk}
    [group] = group_runs(runs, by="seed")
    assert sorted(group.run_ids) == sorted([resumed.pk, other.pk])


def test_a_group_holds_only_runs_its_viewer_may_see(owner, other_user):
    mine = make_experiment(owner)
    theirs = make_experiment(other_user)
    a = config_run(owner, mine, 1, trainer__seed=1)
    b = config_run(owner, mine, 2, trainer__seed=2)
    c = config_run(other_user, theirs, 1, trainer__seed=3)  # the same config, another member's
    [group] = group_runs(list(run_list_for_user(user=owner)), by="seed")
    assert sorted(group.run_ids) == sorted([a.pk, b.pk])
    found = run_group_for_user(user=owner, token=group.token)
    assert sorted(found.run_ids) == sorted([a.pk, b.pk])
    # A token names a config, not runs: the other member's group of it holds their run alone.
    assert run_group_for_user(user=other_user, token=group.token).run_ids == [c.pk]
    c.delete()
    with pytest.raises(Run.DoesNotExist):
        run_group_for_user(user=other_user, token=group.token)
    with pytest.raises(GroupByError, match="malformed"):
        run_group_for_user(user=owner, token="seed:../../x")


def seed_group(owner: Any, seeds: tuple[int, ...] = (1, 2, 3)) -> list[Run]:
    experiment = make_experiment(owner)
    runs = [config_run(owner, experiment, n, trainer__seed=n) for n in seeds]
    for i, run in enumerate(runs):
        record_steps(run, range(1, 11 + 5 * i))  # 10, 15 and 20 steps
    return runs


def test_compare_draws_a_group_and_lists_groups_to_pick(client_in, owner, other_user):
    runs = seed_group(owner)
    single = config_run(owner, make_experiment(owner, name="lonely"), 1, trainer__total_epochs=9)
    page = client_in.get(reverse("runs:compare"))
    [choice] = page.context["group_choices"]
    assert sorted(choice.run_ids) == sorted(r.pk for r in runs)
    assert f'value="{choice.token}"' in page.content.decode()

    page = client_in.get(reverse("runs:compare"), {"group": choice.token, "run": single.pk})
    assert page.status_code == 200
    [group] = page.context["groups"]
    html = page.content.decode()
    assert f'data-compare-group="{group.token}"' in html
    assert f'data-runs="{group.drawn_ids}"' in html
    assert f'data-compare-run="{single.pk}"' in html
    assert 'name="band"' in html

    bad = client_in.get(reverse("runs:compare"), {"group": "seed:<script>"}, follow=True)
    assert bad.status_code == 200 and "is malformed; pick a group" in bad.content.decode()

    # A group by a chosen key (as the runs table links it) is found the same way.
    [by_key] = [
        g
        for g in group_runs(list(run_list_for_user(user=owner)), by="trainer.seed")
        if len(g.runs) == 3
    ]
    page = client_in.get(reverse("runs:compare"), {"group": by_key.token})
    assert [sorted(g.run_ids) for g in page.context["groups"]] == [sorted(r.pk for r in runs)]

    client_in.force_login(other_user)
    assert client_in.get(reverse("runs:compare"), {"group": choice.token}).status_code == 404


def test_group_series_view_returns_the_band_of_visible_runs_only(client_in, owner, other_user):
    runs = seed_group(owner)
    url = reverse("runs:group-series")
    response = client_in.get(url, {"run": [r.pk for r in runs], "name": "critic/score/mean"})
    assert response.status_code == 200
    body = response.json()
    score = body["series"]["critic/score/mean"]
    assert score["step"] == list(range(1, 21))
    assert score["n"] == [3] * 10 + [2] * 5 + [1] * 5
    assert body["last_step"] == 20 and body["members"] == 3
    assert [p["key"] for p in body["panels"]] == ["score"]

    theirs = seed_group(other_user, seeds=(4,))
    mixed = client_in.get(url, {"run": [runs[0].pk, theirs[0].pk]})
    assert mixed.status_code == 404
    assert client_in.get(url, {"run": "x"}).status_code == 400
    assert client_in.get(url).json()["error"].startswith("pass 1 to 50 run ids")
    bad = client_in.get(url, {"run": runs[0].pk, "from": 9, "to": 2})
    assert bad.status_code == 400 and "swap them" in bad.json()["error"]


def test_runs_table_groups_rows_by_seed_or_a_key(client_in, owner):
    runs = seed_group(owner, seeds=(1, 2))
    single = config_run(owner, make_experiment(owner, name="lonely"), 1, trainer__total_epochs=9)
    page = client_in.get(reverse("runs:list"), {"group": "seed"})
    assert page.status_code == 200, page.context["errors"]
    html = page.content.decode()
    [group] = [g for g, _ in page.context["grouped"] if g is not None]
    assert sorted(group.run_ids) == sorted(r.pk for r in runs)
    assert f'data-group="{group.token}"' in html
    assert f"{reverse('runs:compare')}?group={group.token}" in html
    assert f'data-run="{single.pk}"' in html

    by_seed_key = client_in.get(reverse("runs:list"), {"group": "trainer.seed"}, follow=True)
    assert [sorted(g.run_ids) for g, _ in by_seed_key.context["grouped"] if g] == [
        sorted(r.pk for r in runs)
    ]
    by_data_seed = client_in.get(reverse("runs:list"), {"group": "data.seed"}, follow=True)
    assert all(g is None for g, _ in by_data_seed.context["grouped"])  # trainer.seed differs

    bad = client_in.get(reverse("runs:list"), {"group": "no such key!"}, follow=True)
    assert bad.status_code == 400
    assert "is not a config key" in bad.content.decode()


def test_sweep_page_groups_its_members_by_seed_or_a_swept_key(client_in, owner):
    from webapp.sweeps.models import Sweep, SweepMember

    experiment = make_experiment(owner)
    sweep = Sweep.objects.create(
        owner=owner,
        experiment=experiment,
        name="lr x seed",
        spec={"mode": "grid", "params": {}},
        keys=["trainer.seed", LR],
        concurrency=1,
    )
    runs = {}
    for index, (seed, lr) in enumerate(((1, 0.1), (2, 0.1), (1, 0.2), (2, 0.2)), 1):
        run = config_run(
            owner, experiment, index, trainer__seed=seed, actor_rollout_ref__actor__optim__lr=lr
        )
        SweepMember.objects.create(
            sweep=sweep, index=index, run=run, values={"trainer.seed": seed, LR: lr}
        )
        runs[seed, lr] = run.pk

    page = client_in.get(sweep.get_absolute_url(), {"group": "seed"})
    groups = page.context["overlay_groups"]
    assert [sorted(g.run_ids) for g in groups] == [
        sorted([runs[1, 0.1], runs[2, 0.1]]),
        sorted([runs[1, 0.2], runs[2, 0.2]]),
    ]
    assert page.context["overlay"] == []
    html = page.content.decode()
    assert all(f'data-compare-group="{g.token}"' in html for g in groups)

    by_lr = client_in.get(sweep.get_absolute_url(), {"group": LR}).context["overlay_groups"]
    assert [sorted(g.run_ids) for g in by_lr] == [
        sorted([runs[1, 0.1], runs[1, 0.2]]),
        sorted([runs[2, 0.1], runs[2, 0.2]]),
    ]
    ungrouped = client_in.get(sweep.get_absolute_url())
    assert ungrouped.context["overlay_groups"] == [] and len(ungrouped.context["overlay"]) == 4
    bad = client_in.get(sweep.get_absolute_url(), {"group": "x;y"}, follow=True)
    assert "is not a config key" in bad.content.decode()


def test_runs_table_links_keep_the_grouping(client_in, owner):
    seed_group(owner, seeds=(1, 2))
    page = client_in.get(reverse("runs:list"), {"group": "seed", "metric": "critic/score/mean"})
    assert page.context["query"].group == "seed"
    sort = page.context["metrics"][0]["last"]["url"]
    assert "group=seed" in sort
    assert client_in.get(sort).context["grouped"] is not None
