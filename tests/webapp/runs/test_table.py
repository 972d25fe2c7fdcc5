"""The runs table (``/runs/``): metric columns, sorting, filters, notes and tags, ownership."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.http import QueryDict
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tests.webapp.fixtures import make_experiment
from webapp.runs.models import MetricPoint, Run, RunStatus
from webapp.runs.table import (
    RunTableQueryError,
    parse_run_table_query,
    run_table,
)

pytestmark = pytest.mark.django_db

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
SCORE, LOSS = "critic/score/mean", "actor/pg_loss"


def make_run(owner, experiment, number, *, lr=1e-6, status=RunStatus.SUCCEEDED, **fields):
    config = dict(experiment.config)
    config["actor_rollout_ref"] = {
        **config["actor_rollout_ref"],
        "actor": {
            **config["actor_rollout_ref"]["actor"],
            "optim": {**config["actor_rollout_ref"]["actor"]["optim"], "lr": lr},
        },
    }
    return Run.objects.create(
        experiment=experiment, owner=owner, number=number, status=status, config=config, **fields
    )


def record(run, values: list[dict]) -> None:
    MetricPoint.objects.bulk_create(
        MetricPoint(run=run, step=step, wall_time=T0 + timedelta(seconds=step), metrics=metrics)
        for step, metrics in enumerate(values, start=1)
    )


def query(**params) -> QueryDict:
    data = QueryDict(mutable=True)
    for key, value in params.items():
        data.setlist(key, value if isinstance(value, list) else [value])
    return data


@pytest.fixture
def runs(owner):
    experiment = make_experiment(owner, name="gsm8k grpo")
    a = make_run(owner, experiment, 1, lr=1e-6, tags=["baseline"], notes="first try")
    b = make_run(owner, experiment, 2, lr=3e-6, tags=["baseline", "lr-sweep"])
    c = make_run(owner, experiment, 3, lr=1e-5, status=RunStatus.FAILED, tags=["lr-sweep"])
    # a: the score rises then falls (best 0.8, last 0.5); the loss falls (best = min).
    record(a, [{SCORE: 0.2, LOSS: 0.9}, {SCORE: 0.8, LOSS: 0.4}, {SCORE: 0.5, LOSS: 0.6}])
    # b: the last step has no score (a val-only step) and a null loss: last is step 2's.
    record(b, [{SCORE: 0.1, LOSS: 1.5}, {SCORE: 0.6, LOSS: 1.2}, {LOSS: None, "val/x": 1.0}])
    # c: no number recorded (a string is skipped, not cast)
    record(c, [{SCORE: "n/a"}])
    return {"a": a, "b": b, "c": c}


def values(rows, name):
    return {row.run.number: row.values.get(name) for row in rows}


def test_last_and_best_values_of_the_chosen_metrics(owner, runs):
    rows, total = run_table(user=owner, query=parse_run_table_query(query(metric=[SCORE, LOSS])))
    assert total == 3
    score, loss = values(rows, SCORE), values(rows, LOSS)
    assert (score[1].last, score[1].last_step, score[1].best) == (0.5, 3, 0.8)
    assert (score[2].last, score[2].last_step, score[2].best) == (0.6, 2, 0.6)
    assert (loss[1].last, loss[1].best) == (0.6, 0.4)  # a loss: best is the minimum
    assert (loss[2].last, loss[2].last_step, loss[2].best) == (1.2, 2, 1.2)
    assert score[3] is None and loss[3] is None
    # :max overrides the direction a name suggests.
    rows, _ = run_table(user=owner, query=parse_run_table_query(query(metric=f"{LOSS}:max")))
    assert values(rows, LOSS)[1].best == 0.9


def test_sort_by_any_column_runs_without_a_value_last(owner, runs):
    def order(sort):
        q = parse_run_table_query(query(metric=[SCORE, LOSS], sort=sort))
        return [row.run.number for row in run_table(user=owner, query=q)[0]]

    assert order("-best:critic/score/mean") == [1, 2, 3]
    assert order("best:critic/score/mean") == [2, 1, 3]
    assert order("last:critic/score/mean") == [1, 2, 3]
    assert order("-last:critic/score/mean") == [2, 1, 3]
    assert order("best:actor/pg_loss") == [1, 2, 3]
    assert order("run") == [1, 2, 3] and order("-run") == [3, 2, 1]
    assert order("status") == [3, 2, 1]  # failed < succeeded; ties newest first
    assert order("-status") == [2, 1, 3]
    assert order("-created") == [3, 2, 1]


def test_filters_by_tag_status_and_config_value(owner, runs):
    def numbers(**params):
        q = parse_run_table_query(query(**params))
        return sorted(row.run.number for row in run_table(user=owner, query=q)[0])

    assert numbers(tag="baseline") == [1, 2]
    assert numbers(tag=["baseline", "lr-sweep"]) == [2]
    assert numbers(status="failed") == [3]
    assert numbers(status=["failed", "succeeded"]) == [1, 2, 3]
    # The value is read as the schema types the key: 1e-6 is the stored float 1e-06.
    assert numbers(config="actor_rollout_ref.actor.optim.lr=1e-6") == [1]
    assert numbers(config="actor_rollout_ref.actor.optim.lr=0.00001") == [3]
    assert numbers(
        config=["actor_rollout_ref.actor.optim.lr=3e-6", "algorithm.adv_estimator=grpo"]
    ) == [2]
    assert numbers(config="algorithm.adv_estimator=gae") == []


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"sort": "nope"}, "sort='nope' is not a column of this table"),
        ({"sort": "last:critic/score/mean"}, "sort by one of run, status, step, created"),
        ({"status": "done"}, "status='done' is not a run status; use one of queued"),
        ({"config": "lr"}, "config='lr' is not <dotted key>=<value>"),
        (
            {"config": "actor_rollout_ref.actor.optim.lrr=1"},
            "did you mean actor_rollout_ref.actor.optim.lr",
        ),
        (
            {"config": "actor_rollout_ref.actor.optim.lr=fast"},
            "config='actor_rollout_ref.actor.optim.lr=fast'",
        ),
        ({"colums": "x"}, "unknown parameter colums"),
        ({"metric": [f"m{i}" for i in range(13)]}, "pick at most 12"),
    ],
)
def test_bad_parameters_are_named_with_the_fix(params, message):
    with pytest.raises(RunTableQueryError) as caught:
        parse_run_table_query(query(**params))
    assert message in str(caught.value)


def test_the_query_count_does_not_grow_with_runs_or_metrics(owner, runs):
    experiment = runs["a"].experiment
    for number in range(4, 24):
        record(make_run(owner, experiment, number), [{SCORE: 0.1 * i, LOSS: 1.0} for i in range(5)])
    q = parse_run_table_query(query(metric=[SCORE, LOSS, "val/x"], sort="-best:critic/score/mean"))
    with CaptureQueriesContext(connection) as queries:
        rows, total = run_table(user=owner, query=q)
        for row in rows:  # what the template reads of each row
            _ = (row.run.experiment.name, row.run.tags, row.run.notes, row.cells(q.metrics))
    assert total == 23 and len(queries) == 2, [q["sql"] for q in queries]
    # The metric query names the chosen keys only, as parameters.
    assert "jsonb_object_keys" not in queries[1]["sql"]


def test_the_page_shows_columns_filters_and_compare_checkboxes(
    client_in, owner, runs, django_assert_max_num_queries
):
    url = reverse("runs:list") + f"?metric={SCORE}&metric={LOSS}&sort=-best:{SCORE}&tag=baseline"
    with django_assert_max_num_queries(10):  # the first visit also keeps its columns
        response = client_in.get(url)
    assert response.status_code == 200
    page = response.content.decode()
    rows = re.findall(r'<tr data-run="(\d+)">', page)
    assert rows == [str(runs["a"].pk), str(runs["b"].pk)]
    assert f'title="{SCORE}: the last recorded value">last</a>' in page
    assert f'title="{LOSS}: the best value">min</a>' in page
    assert f'name="run" value="{runs["a"].pk}" form="compare-form"' in page
    assert 'action="/runs/compare/"' in page
    assert "first try" in page  # notes in the table
    assert f'class="sorted-desc" title="{SCORE}: the best value">max</a>' in page
    assert "2 runs" in page
    # Every header link keeps the filters and the columns (a shareable view).
    headers = re.findall(r'<th[^>]*><a href="([^"]+)"', page)
    assert headers and all("tag=baseline" in h and "metric=" in h for h in headers)


def test_bad_parameters_get_a_400_page_that_names_them(client_in, runs):
    response = client_in.get(reverse("runs:list") + "?sort=bogus&status=done")
    assert response.status_code == 400
    page = response.content.decode()
    assert "sort=&#x27;bogus&#x27; is not a column of this table" in page
    assert "status=&#x27;done&#x27; is not a run status" in page


def test_another_member_never_sees_the_runs(other_user, runs):
    client = Client()
    client.force_login(other_user)
    page = client.get(reverse("runs:list") + f"?metric={SCORE}").content.decode()
    assert "gsm8k grpo" not in page and "first try" not in page and "baseline" not in page
    assert "0 runs" in page


def test_notes_and_tags_are_edited_on_the_run_page(client_in, runs):
    run = runs["c"]
    detail = reverse("runs:detail", kwargs={"run_id": run.pk})
    client_in.post(reverse("runs:notes", kwargs={"run_id": run.pk}), {"notes": "lr too high\r\n"})
    client_in.post(reverse("runs:tags", kwargs={"run_id": run.pk}), {"add": "Diverged, lr-sweep"})
    run.refresh_from_db()
    assert run.notes == "lr too high" and run.tags == ["lr-sweep", "diverged"]
    page = client_in.get(detail).content.decode()
    assert "lr too high</textarea>" in page and 'value="diverged"' in page
    client_in.post(reverse("runs:tags", kwargs={"run_id": run.pk}), {"remove": "lr-sweep"})
    run.refresh_from_db()
    assert run.tags == ["diverged"]
    response = client_in.post(
        reverse("runs:tags", kwargs={"run_id": run.pk}), {"remove": "nope"}, follow=True
    )
    assert f"run #{run.pk} has no tag &#x27;nope&#x27;" in response.content.decode()
    response = client_in.post(
        reverse("runs:notes", kwargs={"run_id": run.pk}), {"notes": "x" * 10_001}, follow=True
    )
    assert "keep them to 10,000" in response.content.decode()
    response = client_in.post(
        reverse("runs:tags", kwargs={"run_id": run.pk}), {"add": "x" * 51}, follow=True
    )
    assert "is over 50 characters" in response.content.decode()
    run.refresh_from_db()
    assert run.notes == "lr too high" and run.tags == ["diverged"]
    page = client_in.get(reverse("runs:list") + "?tag=diverged").content.decode()
    assert re.findall(r'<tr data-run="(\d+)">', page) == [str(run.pk)]
    assert "lr too high" in page


def test_notes_and_tags_need_the_owner_and_a_csrf_token(owner, other_user, runs):
    run = runs["a"]
    notes = reverse("runs:notes", kwargs={"run_id": run.pk})
    tags = reverse("runs:tags", kwargs={"run_id": run.pk})
    bob = Client()
    bob.force_login(other_user)
    assert bob.post(notes, {"notes": "mine now"}).status_code == 404
    assert bob.post(tags, {"add": "stolen"}).status_code == 404
    assert bob.post(tags, {"remove": "baseline"}).status_code == 404
    alice = Client(enforce_csrf_checks=True)
    alice.force_login(owner)
    assert alice.post(notes, {"notes": "forged"}).status_code == 403
    assert alice.post(tags, {"add": "forged"}).status_code == 403
    run.refresh_from_db()
    assert run.notes == "first try" and run.tags == ["baseline"]
    page = alice.get(reverse("runs:detail", kwargs={"run_id": run.pk})).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    assert (
        alice.post(notes, {"notes": "second try", "csrfmiddlewaretoken": token}).status_code == 302
    )
    run.refresh_from_db()
    assert run.notes == "second try"


LR_KEY = "actor_rollout_ref.actor.optim.lr"


def test_config_and_duration_columns_read_each_runs_config_as_the_schema_types_it(owner, runs):
    Run.objects.filter(pk=runs["a"].pk).update(
        started_at=T0, finished_at=T0 + timedelta(seconds=125)
    )
    Run.objects.filter(pk=runs["b"].pk).update(
        started_at=T0, finished_at=T0 + timedelta(hours=2, minutes=7)
    )
    q = parse_run_table_query(
        query(col=[LR_KEY, "actor_rollout_ref.rollout.n", "algorithm.adv_estimator"])
    )
    assert [c.label for c in q.columns] == ["lr", "n", "adv_estimator"]
    rows, _ = run_table(user=owner, query=q)
    cells = {row.run.pk: (row.config_cells(q.columns), row.duration_text) for row in rows}
    n = runs["a"].config["actor_rollout_ref"]["rollout"]["n"]
    assert cells[runs["a"].pk] == (["1e-6", str(n), "grpo"], "2m 05s")
    assert cells[runs["b"].pk][1] == "2h 07m"
    assert cells[runs["c"].pk][1] == "—"  # never started
    by_lr = parse_run_table_query(query(col=LR_KEY, sort=f"-config:{LR_KEY}"))
    lrs = [row.config_cells(by_lr.columns)[0] for row in run_table(user=owner, query=by_lr)[0]]
    assert lrs == sorted(lrs, key=float, reverse=True)
    longest = parse_run_table_query(query(sort="-duration"))
    assert [row.run.pk for row in run_table(user=owner, query=longest)[0]][:2] == [
        runs["b"].pk,
        runs["a"].pk,
    ]


def test_a_bad_config_filter_keeps_the_columns_and_what_was_typed_and_names_the_problem(
    client_in, runs
):
    url = reverse("runs:list") + f"?metric={SCORE}&col={LR_KEY}&config=lr=1e-6&tag=baseline"
    response = client_in.get(url)
    assert response.status_code == 400
    page = response.content.decode()
    assert f'data-metric="{SCORE}"' in page and f'data-config="{LR_KEY}"' in page
    assert '<input name="config" value="lr=1e-6">' in page  # what was typed
    assert "config=&#x27;lr=1e-6&#x27;: &#x27;lr&#x27; is not a config key; did you mean" in page
    assert "=None" not in page
    # The rest of the query still applies: the tag filter, the columns.
    assert re.findall(r'<tr data-run="(\d+)">', page) == [str(runs["b"].pk), str(runs["a"].pk)]
    empty = client_in.get(reverse("runs:list") + f"?config={LR_KEY}=")
    assert (
        f"give {LR_KEY} a value after &#x27;=&#x27;, e.g. {LR_KEY}=1e-6" in empty.content.decode()
    )
    unknown_col = client_in.get(reverse("runs:list") + "?col=actor_rollout_ref.rollout.nn")
    assert "did you mean actor_rollout_ref.rollout.n" in unknown_col.content.decode()


def test_the_chosen_columns_are_the_members_own_and_come_back_on_the_next_visit(
    client_in, owner, other_user, runs
):
    from webapp.runs.models import RunTableChoice

    table = reverse("runs:list")
    assert client_in.get(table).status_code == 200  # nothing chosen yet: the defaults
    client_in.get(f"{table}?metric={SCORE}&col={LR_KEY}&sort=-best:{SCORE}")
    kept = RunTableChoice.objects.get(owner=owner).params
    assert kept == {"metric": [SCORE], "col": [LR_KEY], "sort": [f"-best:{SCORE}"]}
    again = client_in.get(table)  # the next visit, from the menu
    assert again.status_code == 302
    assert again["Location"] == f"{table}?metric={SCORE}&col={LR_KEY}&sort=-best:{SCORE}"
    tagged = client_in.get(f"{table}?tag=baseline")  # a tag's link keeps the member's columns
    assert tagged["Location"].endswith(
        f"tag=baseline&metric={SCORE}&col={LR_KEY}&sort=-best:{SCORE}"
    )
    page = client_in.get(tagged["Location"]).content.decode()
    remove = re.search(r'<a href="([^"]+)" title="remove this column"', page).group(1)
    assert f"metric={SCORE}" in remove and "col=" not in remove  # the lr column's ×
    # Another member's table is theirs.
    other = Client()
    other.force_login(other_user)
    assert other.get(table).status_code == 200
    # "default columns" forgets them.
    assert client_in.get(f"{table}?reset=1")["Location"] == table
    assert not RunTableChoice.objects.filter(owner=owner).exists()
    assert client_in.get(table).status_code == 200


def test_removing_the_last_column_is_kept_too(client_in, owner, runs):
    from webapp.runs.models import RunTableChoice

    table = reverse("runs:list")
    client_in.get(f"{table}?metric={SCORE}")
    page = client_in.get(f"{table}?metric={SCORE}").content.decode()
    remove = re.search(r'<a href="([^"]+)" title="remove this column"', page).group(1)
    assert client_in.get(remove.replace("&amp;", "&")).status_code == 200
    assert RunTableChoice.objects.get(owner=owner).params["metric"] == []
    assert client_in.get(table).status_code == 302  # to the table with no column, not SCORE
    assert SCORE not in client_in.get(table, follow=True).content.decode().split("<table")[1]
